"""Replicate adapter (api.replicate.com, predictions API).

What Replicate's documentation says, and where:
- A prediction is created with `POST /v1/models/{owner}/{name}/predictions` (official models) or
  `POST /v1/predictions` with a `version`; body `{input, webhook, webhook_events_filter}`; it answers with the
  prediction object; `GET /v1/predictions/{id}` reads it, `POST /v1/predictions/{id}/cancel` cancels it and
  answers with the prediction ("If a prediction is completed, it cannot be canceled": hexdocs.pm/replicate,
  the official Elixir client, Replicate.Predictions; replicate-ruby; replicate-python).
- Statuses `starting | processing | succeeded | failed | canceled`, plus `aborted` (replicate-python PR #460,
  which added it to the terminal set: the `Cancel-After` deadline hit before start).
- Webhooks: the body is the prediction object, the same as "get a prediction"; `webhook_events_filter` ∈
  start | output | logs | completed, `start` and `completed` always sent, output/logs at most every 500 ms; the
  endpoint should answer 2xx within a few seconds or the webhook "might be retried"
  (replicate.com/docs/topics/webhooks/receive-webhook, …/setup-webhook, changelog 2023-02-10).
- Signing is Standard Webhooks: `webhook-id` / `webhook-timestamp` / `webhook-signature`, HMAC-SHA256 over
  `{id}.{timestamp}.{raw body}`, one `whsec_` secret per account from `GET /v1/webhooks/default/secret`
  (trigger.dev/docs/webhooks/providers/replicate; triggerdotdev hand-authored replicate.ts). Verified by
  `providers.webhooks.verify_webhook` (±`webhooks.tolerance_s`, several secrets during rotation); `webhook-id` is
  the event id.
- API predictions' inputs, outputs and files are deleted after one hour.
- Billing for public models: `aborted` is not charged, `canceled` is.

- `GET /v1/predictions` lists the account's predictions (API and web), newest first, 100 per page, as
  `{next, previous, results: [prediction]}` with `next` the URL of the following page or null; each result
  carries `id`, `created_at`, `status`, `model`, `version`, `input` and `data_removed`. `created_after` (at or
  after) and `created_before` (before) filter by creation time, ISO 8601 (replicate-python-stainless,
  `resources/predictions.py` `list` and `pagination.py` `CursorURLPageWithCreatedFilters`, generated from the
  OpenAPI spec). `list_jobs` reads every page; reconciliation matches the echoed `input` to our request.

Not documented, so [inference]:
- No idempotency key or client reference exists (searched, not found): `find` is Unsupported and
  `supports_lookup_by_request_key` is False; an ambiguous submit is reconciled by listing instead.
- A listed prediction's `input` is what we sent (the model input keys below, unchanged); after the hour of
  retention it is gone (`data_removed`), which only matters past the reconciliation window.
- The hour of output retention is counted from `created_at` (the docs do not name the start; the earliest
  candidate is the safe one).
- The model input keys (`prompt`, `duration`, `aspect_ratio`, `resolution`, `seed`, `image`) follow the common
  video models; each model's schema is its own, so a model with other names needs its own mapping.
- Error bodies are problem+json (`detail`, `title`); 504 from the API gateway is Ambiguous (the prediction may
  exist); other explicit 5xx mean not created.
- A `failed` prediction's billing is left unknown (compute time may have been charged).
- References: every model names its own inputs, so `MODELS` lists the ones we know (from each model's page on
  replicate.com, as recalled, not re-read): google/veo-3* `image` (+ `last_frame` on 3.1), 4/6/8 s, 16:9 and
  9:16; kwaivgi/kling-v2.1 `start_image` + `end_image`, 5/10 s; runwayml/gen4-aleph `video` (required) +
  `reference_image`. Any other model gets one `image` and no video. Replicate documents no size limit for inputs
  given by URL: we hold images to 10 MB and videos to 32 MB, the smallest limits of the vendors we call
  (Kling's image limit, Runway's video limit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlsplit

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
    JobSummary,
    NotFound,
    Observation,
    Output,
    QueryFailed,
    SubmitResult,
    TooLate,
    Unsupported,
    units_to_seconds,
)
from aivedio_engine.providers.fingerprint import echoed_fingerprint
from aivedio_engine.providers.webhooks import DEFAULT_TOLERANCE_S, verify_webhook

DEFAULT_BASE_URL = "https://api.replicate.com"
OUTPUT_URL_TTL_S = 3600
WEBHOOK_EVENTS = ["start", "completed"]  # output/logs events would only add traffic

STATUSES = {
    "starting": JobStatus.QUEUED,
    "processing": JobStatus.RUNNING,
    "succeeded": JobStatus.SUCCEEDED,
    "failed": JobStatus.FAILED,
    "canceled": JobStatus.CANCELED,
    "aborted": JobStatus.ABORTED,
}
BILLED = {JobStatus.SUCCEEDED: True, JobStatus.CANCELED: True, JobStatus.ABORTED: False}
TERMINAL = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED, JobStatus.ABORTED}
IMAGE_BYTES, VIDEO_BYTES = 10 * MB, 32 * MB
_VEO = ("16:9", "9:16")


@dataclass(frozen=True, slots=True)
class ModelInputs:
    """Where one model reads its references: image input names in order (first frame, last frame), video input."""

    limits: ModelLimits
    image_fields: tuple[str, ...] = ("image",)
    video_field: str | None = None


DEFAULT_INPUTS = ModelInputs(ModelLimits(1, 0, 0, IMAGE_BYTES, 0))
MODELS: dict[str, ModelInputs] = {
    "google/veo-3": ModelInputs(ModelLimits(1, 0, 0, IMAGE_BYTES, 0, _VEO, (4, 6, 8))),
    "google/veo-3-fast": ModelInputs(ModelLimits(1, 0, 0, IMAGE_BYTES, 0, _VEO, (4, 6, 8))),
    "google/veo-3.1": ModelInputs(ModelLimits(2, 0, 0, IMAGE_BYTES, 0, _VEO, (4, 6, 8)), ("image", "last_frame")),
    "google/veo-3.1-fast": ModelInputs(ModelLimits(2, 0, 0, IMAGE_BYTES, 0, _VEO, (4, 6, 8)), ("image", "last_frame")),
    "kwaivgi/kling-v2.1": ModelInputs(
        ModelLimits(2, 0, 0, IMAGE_BYTES, 0, ("16:9", "9:16", "1:1"), (5, 10)), ("start_image", "end_image")
    ),
    "runwayml/gen4-aleph": ModelInputs(
        ModelLimits(1, 1, 1, IMAGE_BYTES, VIDEO_BYTES, durations=(5,)), ("reference_image",), "video"
    ),
}


def model_inputs(model: str) -> ModelInputs:
    return MODELS.get(model.partition(":")[0], DEFAULT_INPUTS)


def model_limits(model: str) -> ModelLimits:
    return model_inputs(model).limits


#: 100 predictions a page; a reconciliation window never needs more unless the account is very busy
MAX_LIST_PAGES = 50


class ReplicateProvider:
    def __init__(
        self,
        name: str,
        settings: ProviderSettings,
        http: HttpClient | None = None,
        *,
        webhook_tolerance_s: float = DEFAULT_TOLERANCE_S,
    ) -> None:
        self.name = name
        self._settings = settings
        self._tolerance_s = webhook_tolerance_s
        self._http = v.client_for(settings, DEFAULT_BASE_URL, http)
        self.capabilities = v.capabilities(
            settings,
            default_max_duration_s=10,
            default_resolutions=("720p",),
            supports_callbacks=True,
            supports_lookup_by_request_key=False,
            supports_cancel=True,
            output_url_ttl_s=OUTPUT_URL_TTL_S,
            cancel_is_billed=True,
            model_limits=model_limits,
        )

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._settings.api_key.get_secret_value()}"}

    def submit(self, request: GenerationRequest, request_key: str) -> SubmitResult:
        # request_key has nowhere to go: Replicate takes no idempotency key or client reference.
        inputs = model_inputs(request.model)
        refused = v.over_limits(request, inputs.limits)
        if refused is not None:
            return refused
        model_input: dict[str, Any] = {
            "prompt": request.prompt,
            "duration": request.duration_s,
            "aspect_ratio": request.aspect_ratio,
            "resolution": request.resolution,
        }
        if request.seed is not None:
            model_input["seed"] = request.seed
        model_input.update(zip(inputs.image_fields, request.reference_urls, strict=False))
        if inputs.video_field and request.reference_video_urls:
            model_input[inputs.video_field] = request.reference_video_urls[0]
        body: dict[str, Any] = {"input": model_input}
        if request.callback_url:
            body["webhook"] = request.callback_url
            body["webhook_events_filter"] = WEBHOOK_EVENTS
        model, _, version = request.model.partition(":")
        if version:
            body["version"] = version
            path = "/v1/predictions"
        else:
            path = f"/v1/models/{model}/predictions"
        resp = v.send_submit(self._http, "POST", path, json=body, headers=self._headers())
        if not isinstance(resp, Response):
            return resp
        data = v.json_object(resp.body)
        if 200 <= resp.status < 300:
            job_id = data.get("id") if data else None
            if not data or not isinstance(job_id, str) or not job_id:
                return Ambiguous(f"HTTP {resp.status} without a prediction id")
            obs = self._observe(data, job_id, event_id=None)
            return Accepted(job_id, obs if isinstance(obs, Observation) else None)
        return v.reject_submit(resp, message=v.error_text(data, "detail", "title"))

    def query(self, job_id: str) -> Observation | NotFound | QueryFailed:
        resp = v.send_query(self._http, "GET", f"/v1/predictions/{job_id}", headers=self._headers())
        if not isinstance(resp, Response):
            return resp
        if resp.status != 200:
            return v.query_failure(resp)
        data = v.json_object(resp.body)
        if data is None:
            return QueryFailed(ErrorClass.QUERY_FAILED, "prediction body is not a JSON object")
        return self._observe(data, job_id, event_id=None)

    def find(self, request_key: str) -> Unsupported:
        return Unsupported()

    def list_jobs(
        self, created_after: datetime, created_before: datetime
    ) -> list[JobSummary] | Unsupported | QueryFailed:
        window = {"created_after": _iso(created_after), "created_before": _iso(created_before)}
        path, params = "/v1/predictions", dict(window)
        origin = urlsplit(self._settings.base_url or DEFAULT_BASE_URL).netloc
        jobs: list[JobSummary] = []
        for _ in range(MAX_LIST_PAGES):
            resp = v.send_query(self._http, "GET", path, params=params, headers=self._headers())
            if not isinstance(resp, Response):
                return resp
            if resp.status != 200:
                failure = v.query_failure(resp)
                return failure if isinstance(failure, QueryFailed) else QueryFailed(ErrorClass.QUERY_FAILED, "HTTP 404")
            data = v.json_object(resp.body)
            results = data.get("results") if data else None
            if not isinstance(results, list):
                return QueryFailed(ErrorClass.QUERY_FAILED, "prediction list without results")
            for item in results:
                summary = self._summary(item)
                if summary is None:  # a prediction we cannot identify could be ours: the listing proves nothing
                    return QueryFailed(ErrorClass.QUERY_FAILED, "unreadable prediction in the list")
                if created_after <= summary.created_at < created_before:
                    jobs.append(summary)
            nxt = data.get("next") if data else None
            if not isinstance(nxt, str) or not nxt:
                return jobs
            url = urlsplit(nxt)
            if url.netloc and url.netloc != origin:  # never send the API token to another host
                return QueryFailed(ErrorClass.QUERY_FAILED, "next page on another host")
            # the page URL carries the cursor; the filters are sent again as the official client does
            path, params = url.path or path, {**window, **dict(parse_qsl(url.query))}
        return QueryFailed(ErrorClass.QUERY_FAILED, f"prediction list longer than {MAX_LIST_PAGES} pages")

    def cancel(self, job_id: str) -> Canceled | TooLate | Unsupported | QueryFailed:
        resp = v.send_query(self._http, "POST", f"/v1/predictions/{job_id}/cancel", headers=self._headers())
        if not isinstance(resp, Response):
            return resp
        if not 200 <= resp.status < 300:
            failure = v.query_failure(resp)
            return (
                failure
                if isinstance(failure, QueryFailed)
                else QueryFailed(ErrorClass.QUERY_FAILED, "prediction not found")
            )
        data = v.json_object(resp.body) or {}
        status = STATUSES.get(str(data.get("status")))
        if status in TERMINAL and status not in (JobStatus.CANCELED, JobStatus.ABORTED):
            return TooLate()
        # canceled, aborted, or still winding down: the cancel is in; the final status arrives by poll or webhook
        return Canceled()

    def parse_callback(self, headers: Mapping[str, str], raw_body: bytes, now: datetime) -> list[Observation]:
        verified = verify_webhook(
            headers,
            raw_body,
            self._settings.webhook_secrets,
            now,
            tolerance_s=self._tolerance_s,
            max_body_bytes=v.MAX_CALLBACK_BYTES,
        )
        data = verified.json()
        if not isinstance(data, dict):
            raise CallbackRejected("body is not a prediction object")
        job_id = data.get("id")
        if not isinstance(job_id, str) or not job_id:
            raise CallbackRejected("prediction without an id")
        obs = self._observe(data, job_id, event_id=verified.msg_id)
        if isinstance(obs, QueryFailed):
            raise CallbackRejected(obs.message or "unreadable prediction")
        return [obs]

    def _summary(self, item: Any) -> JobSummary | None:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            return None
        status, created = STATUSES.get(str(item.get("status"))), v.parse_iso(item.get("created_at"))
        if status is None or created is None:
            return None
        # we send "owner/name" or "owner/name:version" (see submit); the list names model and version apart
        model, version = item.get("model"), item.get("version")
        if isinstance(version, str) and f"{model}:{version}" in self._settings.models:
            model = f"{model}:{version}"
        inp = raw if isinstance(raw := item.get("input"), dict) else {}
        echo = {
            "prompt": inp.get("prompt"),
            "model": model,
            "duration_s": inp.get("duration"),
            "resolution": inp.get("resolution"),
            "aspect_ratio": inp.get("aspect_ratio"),
            "seed": inp.get("seed"),
        }
        fingerprint = echoed_fingerprint(echo)
        if fingerprint is None and model not in self._settings.models:
            # another model's prediction (the playground, another app) is certainly not ours: any non-matching
            # fingerprint says so, where None would block every "not created" verdict in the window
            fingerprint = b"other-model:" + str(model).encode()
        return JobSummary(job_id=item["id"], created_at=created, status=status, fingerprint=fingerprint)

    def _observe(self, data: dict[str, Any], job_id: str, event_id: str | None) -> Observation | QueryFailed:
        status = STATUSES.get(str(data.get("status")))
        if status is None:
            return QueryFailed(ErrorClass.QUERY_FAILED, f"unknown Replicate status {data.get('status')!r}")
        created = v.parse_iso(data.get("created_at"))
        updated = v.parse_iso(data.get("completed_at")) or v.parse_iso(data.get("started_at")) or created
        outputs: tuple[Output, ...] = ()
        error_code = None
        if status is JobStatus.SUCCEEDED:
            expires = v.plus(created, OUTPUT_URL_TTL_S)
            outputs = tuple(Output(url=u, expires_at=expires, index=i) for i, u in enumerate(_urls(data.get("output"))))
            if data.get("data_removed") is True:
                outputs, error_code = (), "data_removed"  # past the hour: the files are gone
        error = data.get("error")
        # `metrics.predict_time`: the seconds of hardware time the prediction ran, what Replicate bills by for
        # time-priced models; as output seconds only with the provider's configured rate
        metrics = data.get("metrics")
        predict = metrics.get("predict_time") if isinstance(metrics, dict) and status in TERMINAL else None
        compute = float(predict) if isinstance(predict, int | float) and not isinstance(predict, bool) else None
        billed = BILLED.get(status)
        return Observation(
            job_id=job_id,
            status=status,
            provider_updated_at=updated,
            outputs=outputs,
            error_code=error_code,
            error_message=error[:500] if isinstance(error, str) and error else None,
            billed=billed,
            vendor_cost=compute,
            billed_seconds=units_to_seconds(compute, self._settings.vendor_unit_seconds) if billed else None,
            event_id=event_id,
            raw=data,
        )


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _urls(output: Any) -> list[str]:
    """A prediction's output is a URL, a list of URLs, or an object holding them, depending on the model."""
    if isinstance(output, str):
        return [output] if output.startswith(("https://", "http://")) else []
    if isinstance(output, list):
        return [u for item in output for u in _urls(item)]
    if isinstance(output, dict):
        return [u for item in output.values() for u in _urls(item)]
    return []
