"""Runway adapter (api.dev.runwayml.com).

What Runway's documentation says, and where:
- Headers `Authorization: Bearer <secret>` and `X-Runway-Version: 2024-11-06`; base URL
  `https://api.dev.runwayml.com` (runwayml/skills `runway.md`, github.com/runwayml/skills PR #9; rw-api-reference).
- `POST /v1/image_to_video` {model, promptImage (https URL / data URI), promptText ≤ 1000 chars, ratio, duration}
  and `POST /v1/text_to_video` {model, promptText, ratio, duration}; both answer `{"id": …}` (rw-api-reference;
  api-evangelist/runway task schema). Ratios are pixel pairs ("1280:720", "720:1280", "960:960", "1104:832", …).
- `GET /v1/tasks/{id}`: `status` ∈ PENDING | THROTTLED | RUNNING | SUCCEEDED | FAILED | CANCELLED, `output`
  (list of URLs) on SUCCEEDED, `failure` + `failureCode` on FAILED (docs.dev.runwayml.com/assets/outputs;
  ). `DELETE /v1/tasks/{id}` "cancels or deletes" a task (Runway API reference,
  Task-management, as linked from comfy_api_nodes/nodes_runway.py).
- Retry matrix (docs.dev.runwayml.com/api-details/errors): 400, 401, 404, 405 no; 429, 502, 503 "shedding
  load", 504 "overloaded and not able to satisfy the request" yes, with exponential backoff and jitter.
- Output URLs "are ephemeral: they will expire within 24-48 hours of accessing the API … do not expose them
  directly in your product" (docs.dev.runwayml.com/assets/outputs). We take the lower bound, 24 h, counted from
  the response's Date header (else the task's createdAt, which is earlier and so safer).

- References: `promptImage` is one URL, or a list of `{uri, position: first | last}` for models that take a last
  frame; `POST /v1/video_to_video` {model: gen4_aleph, videoUri, promptText, ratio, references: [{type: image,
  uri}]} edits a source clip (Runway API reference, video_to_video, as mirrored by CometAPI's "official format"
  page). Input size limits by URL: image 16 MB, video 32 MB; URLs must be https, no redirects, with
  Content-Type and Content-Length, HEAD supported (docs.dev.runwayml.com/assets/inputs). An input image's
  width/height must lie between 0.5 and 2 (docs.comfy.org, Runway Gen4 Turbo node, quoting Runway's check).
- Ratio sets per model: gen4_turbo and gen4_aleph 1280:720, 720:1280, 1104:832, 832:1104, 960:960, 1584:672;
  gen3a_turbo 1280:768, 768:1280; veo3* 1280:720, 720:1280 (1920:1080, 1080:1920 at 1080p).

Not documented, so [inference]:
- Durations: gen4_turbo and gen3a_turbo 5 or 10 s (the 2024-11-06 reference; later pages allow 2–10, the narrower
  set is the safe one); Veo 3.x 4, 6 or 8 s; gen4_aleph takes no duration (the output follows the source clip):
  we accept 5 s only, the shortest clip Runway bills for it.
- gen3a_turbo and veo3.1* take a first and a last frame (two images); gen4_turbo only a first frame.
- No client idempotency key or external id exists: `find` is Unsupported and `supports_lookup_by_request_key` is
  False; an ambiguous submit can only be reconciled by a human or the invoice.
- 500 is not in Runway's matrix; we treat an explicit 500 like the other 5xx (job not created).
- No generation webhook is documented, so we never ask for one (`supports_callbacks=False`).
  `parse_callback` exists for a relay of ours that forwards task objects: it accepts a body only when the
  header `X-Aivedio-Callback-Token` equals one of the configured `webhook_secrets`.
- A fresh task id may briefly answer 404 (a relay's docs warn of `task_not_exist`): NotFound, "not visible yet".
- `progress` (0–1) on RUNNING tasks appears in SDK responses, not in the pages read; used for display only.
- Billing: only SUCCEEDED is marked billed; Runway documents nothing about charges for failed or cancelled tasks.
  A task object carries no credits or billed seconds (usage is reported per account, by `GET /v1/organization`):
  the observation's billed units stay None, so settlement charges the price list × the requested seconds, and
  `aivedio ledger reconcile` corrects it from the invoice.
- Because DELETE also deletes finished tasks (and with them the output), `cancel` reads the task first and
  answers TooLate without deleting when it has already ended. A task finishing between the read and the
  DELETE can still be deleted: that window is Runway's API, not ours to close.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from aivedio_engine.config import ProviderSettings
from aivedio_engine.domain.references import MB, ModelLimits
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.httpclient import HttpClient, Response
from aivedio_engine.providers import _vendor as v
from aivedio_engine.providers.base import (
    Accepted,
    Ambiguous,
    CallbackRejected,
    Canceled,
    GenerationRequest,
    JobStatus,
    NotFound,
    Observation,
    Output,
    QueryFailed,
    Rejected,
    SubmitResult,
    TooLate,
    Unsupported,
)

DEFAULT_BASE_URL = "https://api.dev.runwayml.com"
API_VERSION = "2024-11-06"
OUTPUT_URL_TTL_S = 24 * 3600

STATUSES = {
    "PENDING": JobStatus.QUEUED,
    "THROTTLED": JobStatus.THROTTLED,
    "RUNNING": JobStatus.RUNNING,
    "PROCESSING": JobStatus.RUNNING,  # spelled so in third-party schemas; harmless to accept
    "SUCCEEDED": JobStatus.SUCCEEDED,
    "FAILED": JobStatus.FAILED,
    "CANCELLED": JobStatus.CANCELED,
}
TERMINAL = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED}

#: aspect ratio → Runway's pixel ratio, per model family (the ratio set depends on the model)
GEN4_RATIOS = {
    "16:9": "1280:720",
    "9:16": "720:1280",
    "1:1": "960:960",
    "4:3": "1104:832",
    "3:4": "832:1104",
    "21:9": "1584:672",
}
GEN3A_RATIOS = {"16:9": "1280:768", "9:16": "768:1280"}
VEO_RATIOS = {"16:9": "1280:720", "9:16": "720:1280"}
HD_RATIOS = {"16:9": "1920:1080", "9:16": "1080:1920"}
IMAGE_BYTES = 16 * MB  # by URL; a data URI would allow 5 MB, and we always send URLs
VIDEO_BYTES = 32 * MB
IMAGE_RATIO = (0.5, 2.0)

#: model → (its limits, its pixel ratios); a model not listed gets gen4_turbo's, the narrowest common shape
MODELS: dict[str, tuple[ModelLimits, dict[str, str]]] = {
    "gen4_turbo": (
        ModelLimits(1, 0, 0, IMAGE_BYTES, 0, tuple(GEN4_RATIOS), (5, 10), IMAGE_RATIO),
        GEN4_RATIOS,
    ),
    "gen3a_turbo": (
        ModelLimits(2, 0, 0, IMAGE_BYTES, 0, tuple(GEN3A_RATIOS), (5, 10), IMAGE_RATIO),
        GEN3A_RATIOS,
    ),
    "gen4_aleph": (
        ModelLimits(1, 1, 1, IMAGE_BYTES, VIDEO_BYTES, tuple(GEN4_RATIOS), (5,), IMAGE_RATIO),
        GEN4_RATIOS,
    ),
    "veo3": (ModelLimits(1, 0, 0, IMAGE_BYTES, 0, tuple(VEO_RATIOS), (4, 6, 8), IMAGE_RATIO), VEO_RATIOS),
    "veo3.1": (ModelLimits(2, 0, 0, IMAGE_BYTES, 0, tuple(VEO_RATIOS), (4, 6, 8), IMAGE_RATIO), VEO_RATIOS),
    "veo3.1_fast": (ModelLimits(2, 0, 0, IMAGE_BYTES, 0, tuple(VEO_RATIOS), (4, 6, 8), IMAGE_RATIO), VEO_RATIOS),
}


def model_limits(model: str) -> ModelLimits:
    return MODELS.get(model, MODELS["gen4_turbo"])[0]


class RunwayProvider:
    def __init__(self, name: str, settings: ProviderSettings, http: HttpClient | None = None) -> None:
        self.name = name
        self._settings = settings
        self._http = v.client_for(settings, DEFAULT_BASE_URL, http)
        self.capabilities = v.capabilities(
            settings,
            default_max_duration_s=10,
            default_resolutions=("720p",),
            supports_callbacks=False,
            supports_lookup_by_request_key=False,
            supports_cancel=True,
            output_url_ttl_s=OUTPUT_URL_TTL_S,
            model_limits=model_limits,
        )

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._settings.api_key.get_secret_value()}", "X-Runway-Version": API_VERSION}

    # --- submit --------------------------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest, request_key: str) -> SubmitResult:
        # request_key has nowhere to go: Runway takes no idempotency key or external id.
        refused = v.over_limits(request, model_limits(request.model))
        if refused is not None:
            return refused
        ratio = _ratio(request.model, request.aspect_ratio, request.resolution)
        if ratio is None:
            return Rejected(
                ErrorClass.LOCAL_INVALID,
                code="unsupported_ratio",
                message=f"no Runway ratio for {request.aspect_ratio} at {request.resolution}",
            )
        path, body = _body(request, ratio)
        resp = v.send_submit(self._http, "POST", path, json=body, headers=self._headers())
        if not isinstance(resp, Response):
            return resp
        data = v.json_object(resp.body)
        if 200 <= resp.status < 300:
            job_id = data.get("id") if data else None
            if not isinstance(job_id, str) or not job_id:
                return Ambiguous(f"HTTP {resp.status} without a task id")
            return Accepted(job_id)
        return v.reject_submit(
            resp, message=v.error_text(data, "error", "message"), code=_code(data), retryable_gateway_timeout=True
        )

    # --- query ---------------------------------------------------------------------------------------------------

    def query(self, job_id: str) -> Observation | NotFound | QueryFailed:
        resp = v.send_query(self._http, "GET", f"/v1/tasks/{job_id}", headers=self._headers())
        if not isinstance(resp, Response):
            return resp
        if resp.status != 200:
            return v.query_failure(resp)
        data = v.json_object(resp.body)
        if data is None:
            return QueryFailed(ErrorClass.QUERY_FAILED, "task body is not a JSON object")
        return self._observe(data, job_id, v.response_date(resp.headers), event_id=None)

    def find(self, request_key: str) -> Unsupported:
        return Unsupported()

    def list_jobs(self, created_after: datetime, created_before: datetime) -> Unsupported:
        return Unsupported()

    # --- cancel --------------------------------------------------------------------------------------------------

    def cancel(self, job_id: str) -> Canceled | TooLate | Unsupported | QueryFailed:
        current = self.query(job_id)
        if isinstance(current, NotFound):
            return QueryFailed(ErrorClass.QUERY_FAILED, "task not found")
        if isinstance(current, QueryFailed):
            return current
        if current.status in TERMINAL:
            # DELETE on a finished task deletes it, output included: never do that to a success
            return Canceled() if current.status is JobStatus.CANCELED else TooLate()
        resp = v.send_query(self._http, "DELETE", f"/v1/tasks/{job_id}", headers=self._headers())
        if not isinstance(resp, Response):
            return resp
        if 200 <= resp.status < 300:
            return Canceled()
        failure = v.query_failure(resp)
        return failure if isinstance(failure, QueryFailed) else QueryFailed(ErrorClass.QUERY_FAILED, "task not found")

    # --- callbacks -----------------------------------------------------------------------------------------------

    def parse_callback(self, headers: Mapping[str, str], raw_body: bytes, now: datetime) -> list[Observation]:
        v.check_token(headers, self._settings.webhook_secrets, binding=None)
        data = v.callback_json(raw_body)
        job_id = data.get("id")
        if not isinstance(job_id, str) or not job_id:
            raise CallbackRejected("task object without an id")
        obs = self._observe(data, job_id, now, event_id=v.header(headers, "x-aivedio-event-id"))
        if isinstance(obs, QueryFailed):
            raise CallbackRejected(obs.message or "unreadable task")
        return [obs]

    # --- parsing -------------------------------------------------------------------------------------------------

    def _observe(
        self, data: dict[str, Any], job_id: str, seen_at: datetime | None, event_id: str | None
    ) -> Observation | QueryFailed:
        status = STATUSES.get(str(data.get("status")))
        if status is None:
            return QueryFailed(ErrorClass.QUERY_FAILED, f"unknown Runway status {data.get('status')!r}")
        created = v.parse_iso(data.get("createdAt"))
        minted = seen_at or created
        outputs: tuple[Output, ...] = ()
        if status is JobStatus.SUCCEEDED:
            urls = data.get("output") or []
            outputs = tuple(
                Output(url=u, expires_at=v.plus(minted, OUTPUT_URL_TTL_S), index=i)
                for i, u in enumerate(urls)
                if isinstance(u, str) and u
            )
        return Observation(
            job_id=job_id,
            status=status,
            progress=_progress(data.get("progress")),
            outputs=outputs,
            error_code=_str(data.get("failureCode")) if status is JobStatus.FAILED else None,
            error_message=_str(data.get("failure")) if status is JobStatus.FAILED else None,
            billed=True if status is JobStatus.SUCCEEDED else None,
            event_id=event_id,
            raw=data,
        )


def _body(request: GenerationRequest, ratio: str) -> tuple[str, dict[str, Any]]:
    """The endpoint and body: video_to_video for a source clip, image_to_video for frames, else text_to_video."""
    body: dict[str, Any] = {"model": request.model, "promptText": request.prompt[:1000], "ratio": ratio}
    if request.seed is not None:
        body["seed"] = request.seed
    images = list(request.reference_urls)
    if request.reference_video_urls:
        body["videoUri"] = request.reference_video_urls[0]
        if images:
            body["references"] = [{"type": "image", "uri": u} for u in images]
        return "/v1/video_to_video", body  # no duration: the output follows the source clip
    body["duration"] = request.duration_s
    if len(images) == 1:
        body["promptImage"] = images[0]
    elif images:
        body["promptImage"] = [{"uri": u, "position": p} for u, p in zip(images, ("first", "last"), strict=False)]
    return ("/v1/image_to_video" if images else "/v1/text_to_video"), body


def _ratio(model: str, aspect_ratio: str, resolution: str) -> str | None:
    parts = aspect_ratio.split(":")
    if len(parts) == 2 and all(p.isdigit() and int(p) >= 100 for p in parts):
        return aspect_ratio  # already one of Runway's pixel ratios
    if resolution == "1080p":
        return HD_RATIOS.get(aspect_ratio)
    return MODELS.get(model, MODELS["gen4_turbo"])[1].get(aspect_ratio)


def _progress(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    pct = value * 100 if value <= 1 else value
    return max(0, min(100, int(pct)))


def _str(value: Any) -> str | None:
    return value[:500] if isinstance(value, str) and value else None


def _code(data: dict[str, Any] | None) -> str | None:
    code = data.get("code") if data else None
    return code if isinstance(code, str) else None
