"""The `sim` provider adapter: the engine's side of the simulator, written like any thin vendor adapter.

It translates HTTP outcomes into the Protocol's values and judges one thing only: whether a failed submit may
have created a job. No retries, no sleeps, no database — the engine's failure policy decides what happens next.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

from aivedio_engine.config import ProviderSettings
from aivedio_engine.domain.references import MB, ModelLimits
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.httpclient import HttpClient, NotSent, Response, SentUnknown, Timeouts
from aivedio_engine.providers._vendor import over_limits
from aivedio_engine.providers.base import (
    Accepted,
    Ambiguous,
    CallbackRejected,
    Canceled,
    Capabilities,
    GenerationRequest,
    JobStatus,
    JobSummary,
    NotFound,
    Observation,
    Output,
    QueryFailed,
    Rejected,
    SubmitResult,
    TooLate,
    Unsupported,
)
from aivedio_engine.providers.fingerprint import echoed_fingerprint
from aivedio_engine.providers.webhooks import DEFAULT_TOLERANCE_S, verify_webhook

HTTP_TIMEOUTS = Timeouts(connect=2.0, read=15.0, write=15.0, pool=2.0)
MAX_CALLBACK_BYTES = 256 * 1024
#: a window of reconciliation holds a few minutes of jobs; more pages than this and the listing is not trusted
MAX_LIST_PAGES = 50
#: the simulator is a vendor with generous, but finite, limits: several images and a source clip, any duration
SIM_LIMITS = ModelLimits(
    max_reference_images=4, max_reference_videos=1, max_image_bytes=20 * MB, max_video_bytes=200 * MB, max_outputs=4
)


def model_limits(model: str) -> ModelLimits:
    return SIM_LIMITS


class SimProvider:
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
        key = settings.api_key.get_secret_value()
        self._http = http or HttpClient(
            settings.base_url, HTTP_TIMEOUTS, headers={"Authorization": f"Bearer {key}"} if key else None
        )
        self._tolerance_s = webhook_tolerance_s
        models = settings.models
        self.capabilities = Capabilities(
            models=tuple(models),
            max_duration_s=max((m.max_duration_s for m in models.values()), default=10),
            resolutions=tuple(sorted({r for m in models.values() for r in m.resolutions})),
            supports_callbacks=bool(settings.webhook_secrets),
            supports_lookup_by_request_key=settings.supports_lookup_by_request_key,
            supports_cancel=True,
            output_url_ttl_s=settings.output_url_ttl_s,
            cancel_is_billed=True,  # the sim charges a cancel once the job has started
            model_limits={m: model_limits(m) for m in models},
        )

    def submit(self, request: GenerationRequest, request_key: str) -> SubmitResult:
        refused = over_limits(request, SIM_LIMITS)
        if refused is not None:
            return refused
        body: dict[str, Any] = {
            "prompt": request.prompt,
            "model": request.model,
            "duration_s": request.duration_s,
            "resolution": request.resolution,
            "aspect_ratio": request.aspect_ratio,
        }
        if request.seed is not None:
            body["seed"] = request.seed
        if request.n > 1:
            body["n"] = request.n
        if request.reference_urls:
            body["reference_urls"] = list(request.reference_urls)
        if request.reference_video_urls:
            body["reference_video_urls"] = list(request.reference_video_urls)
        if request.callback_url:
            body["callback_url"] = request.callback_url
        try:
            r = self._http.request("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": request_key})
        except NotSent as exc:
            return Rejected(ErrorClass.CONNECT_FAILED, message=str(exc))
        except SentUnknown as exc:
            return Ambiguous(f"submit outcome unknown: {exc}")
        if 200 <= r.status < 300:
            data = _json(r)
            if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data["id"]:
                # a 2xx means the job exists; without its id only a lookup can find it
                return Ambiguous(f"accepted without a job id (HTTP {r.status})")
            return Accepted(data["id"], _observation(data))
        code = _error_code(r)
        if r.status == 429:
            return Rejected(ErrorClass.PROVIDER_RATE_LIMITED, code, "rate limited", _retry_after(r))
        if 400 <= r.status < 500:
            return Rejected(ErrorClass.PROVIDER_REJECTED, code, f"HTTP {r.status}")
        if r.status >= 500:
            # the sim's contract (like fal's and Runway's): an explicit 5xx answer means no job was created
            return Rejected(ErrorClass.PROVIDER_5XX_NOT_ACCEPTED, code, f"HTTP {r.status}", _retry_after(r))
        return Ambiguous(f"unexpected HTTP {r.status} on submit")

    def query(self, job_id: str) -> Observation | NotFound | QueryFailed:
        r = self._get(f"/v1/jobs/{_seg(job_id)}")
        if isinstance(r, QueryFailed):
            return r
        if r.status == 404:
            return NotFound()  # for a fresh id: not visible yet — the engine decides what that means
        return self._observation_or_failure(r)

    def find(self, request_key: str) -> Observation | NotFound | Unsupported | QueryFailed:
        if not self._settings.supports_lookup_by_request_key:
            return Unsupported()
        r = self._get("/v1/jobs", params={"request_key": request_key})
        if isinstance(r, QueryFailed):
            return r
        if r.status == 404:
            return NotFound()
        if r.status == 501:
            return Unsupported()
        return self._observation_or_failure(r)

    def list_jobs(
        self, created_after: datetime, created_before: datetime
    ) -> list[JobSummary] | Unsupported | QueryFailed:
        params: dict[str, Any] = {
            "created_after": _iso(created_after),
            "created_before": _iso(created_before),
            "limit": 100,
        }
        jobs: list[JobSummary] = []
        for _ in range(MAX_LIST_PAGES):
            r = self._get("/v1/jobs", params=params)
            if isinstance(r, QueryFailed):
                return r
            if r.status == 501:
                return Unsupported()
            if r.status != 200:
                return _failure(r)
            data = _json(r)
            items = data.get("jobs") if isinstance(data, dict) else None
            if not isinstance(items, list):
                return QueryFailed(ErrorClass.QUERY_FAILED, "unparseable job list")
            for item in items:
                summary = _summary(item)
                if summary is None:  # a job we cannot even identify could be ours: the listing proves nothing
                    return QueryFailed(ErrorClass.QUERY_FAILED, "unparseable job in the list")
                if created_after <= summary.created_at < created_before:
                    jobs.append(summary)
            cursor = data.get("next")
            if not isinstance(cursor, str) or not cursor:
                return jobs
            params["cursor"] = cursor
        return QueryFailed(ErrorClass.QUERY_FAILED, f"job list longer than {MAX_LIST_PAGES} pages")

    def cancel(self, job_id: str) -> Canceled | TooLate | Unsupported | QueryFailed:
        try:
            r = self._http.request("POST", f"/v1/jobs/{_seg(job_id)}/cancel")
        except (NotSent, SentUnknown) as exc:
            return QueryFailed(ErrorClass.QUERY_FAILED, f"cancel: {exc}")
        if r.status == 200:
            return Canceled()
        if r.status == 409:
            return TooLate()
        if r.status == 501:
            return Unsupported()
        return _failure(r)

    def parse_callback(self, headers: Mapping[str, str], raw_body: bytes, now: datetime) -> list[Observation]:
        verified = verify_webhook(
            headers,
            raw_body,
            self._settings.webhook_secrets,
            now,
            tolerance_s=self._tolerance_s,
            max_body_bytes=MAX_CALLBACK_BYTES,
        )
        data = verified.json()
        if not isinstance(data, dict):
            raise CallbackRejected("callback body is not a JSON object")
        try:
            observation = _observation(data, event_id=verified.msg_id)
        except (KeyError, TypeError, ValueError):
            raise CallbackRejected("callback body is not a sim job") from None
        return [observation]

    def close(self) -> None:
        self._http.close()

    # helpers ---------------------------------------------------------------------------------------------
    def _get(self, path: str, params: Mapping[str, Any] | None = None) -> Response | QueryFailed:
        try:
            return self._http.request("GET", path, params=params)
        except (NotSent, SentUnknown) as exc:
            return QueryFailed(ErrorClass.QUERY_FAILED, str(exc))

    def _observation_or_failure(self, r: Response) -> Observation | QueryFailed:
        if r.status != 200:
            return _failure(r)
        data = _json(r)
        try:
            return _observation(data)
        except (KeyError, TypeError, ValueError):
            return QueryFailed(ErrorClass.QUERY_FAILED, "unparseable job body")


def _observation(data: dict[str, Any], event_id: str | None = None) -> Observation:
    """Map the sim's job JSON. Raises KeyError/TypeError/ValueError on a body that is not a job."""
    if not isinstance(data, dict):
        raise TypeError("job body must be an object")
    job_id, status = data["id"], JobStatus(data["status"])
    if not isinstance(job_id, str) or not job_id:
        raise ValueError("job id")
    outputs: tuple[Output, ...] = ()
    out = data.get("output")
    if isinstance(out, dict) and isinstance(out.get("url"), str):
        outputs = (
            Output(url=out["url"], expires_at=_parse_time(out.get("expires_at")), content_type=out.get("content_type")),
        )
    many = data.get("outputs")
    if isinstance(many, list) and len(many) > 1:  # a job of n outputs lists them all, by index
        outputs = tuple(
            Output(
                url=o["url"],
                expires_at=_parse_time(o.get("expires_at")),
                content_type=o.get("content_type"),
                index=int(o.get("index", i)),
            )
            for i, o in enumerate(many)
            if isinstance(o, dict) and isinstance(o.get("url"), str)
        )
    error = err if isinstance(err := data.get("error"), dict) else {}
    progress = data.get("progress")
    billed = data.get("billed")
    seconds, cost = data.get("billed_seconds"), data.get("cost")
    return Observation(
        job_id=job_id,
        status=status,
        provider_updated_at=_parse_time(data.get("updated_at")),
        progress=progress if isinstance(progress, int) and not isinstance(progress, bool) else None,
        outputs=outputs,
        error_code=error.get("code"),
        error_message=error.get("message"),
        billed=billed if isinstance(billed, bool) else None,
        billed_seconds=_number(seconds),
        billed_outputs=int(b) if (b := _number(data.get("billed_outputs"))) is not None else None,
        vendor_cost=_number(cost),
        refunded=True if data.get("refunded") is True else None,
        request_key=data.get("request_key") if isinstance(data.get("request_key"), str) else None,
        event_id=event_id,
        raw=data,
    )


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    return float(value) if ok else None


def _summary(item: Any) -> JobSummary | None:
    """One listed job, or None when it has no usable id, creation time or status."""
    if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
        return None
    created = _parse_time(item.get("created_at"))
    try:
        status = JobStatus(item.get("status", ""))
    except ValueError:
        return None
    if created is None:
        return None
    return JobSummary(
        job_id=item["id"], created_at=created, status=status, fingerprint=echoed_fingerprint(item.get("request"))
    )


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _json(r: Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


def _error_code(r: Response) -> str | None:
    data = _json(r)
    code = data.get("error") if isinstance(data, dict) else None
    return code if isinstance(code, str) else None


def _retry_after(r: Response) -> float | None:
    value = next((v for k, v in r.headers.items() if k.lower() == "retry-after"), None)
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _failure(r: Response) -> QueryFailed:
    if r.status == 429:
        return QueryFailed(ErrorClass.PROVIDER_RATE_LIMITED, "rate limited", _retry_after(r))
    return QueryFailed(ErrorClass.QUERY_FAILED, f"HTTP {r.status}" + (f" {c}" if (c := _error_code(r)) else ""))


def _seg(job_id: str) -> str:
    # ids come from the vendor (or a callback body): never let one walk into another path
    return quote(job_id, safe="")
