"""What the four vendor adapters (runway, replicate, fal, kling) share: sending with the sent/not-sent split,
turning an HTTP answer into an error class, Retry-After and timestamp parsing, callback body and token checks.

The one judgement that matters for money lives in `reject_submit`: an explicit error answer means the vendor did
not create a job (Rejected), except a gateway timeout, which says the request reached the vendor and nobody knows
what became of it — Ambiguous, unless the vendor documents that status as safe to retry (Runway does for 504).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from pydantic import SecretStr

from aivedio_engine.config import ProviderSettings
from aivedio_engine.domain.references import LimitExceeded, ModelLimits, check_counts, check_shape
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.domain.status import CallbackRejectReason as Reason
from aivedio_engine.httpclient import HttpClient, NotSent, Response, SentUnknown
from aivedio_engine.providers.base import (
    Ambiguous,
    CallbackRejected,
    Capabilities,
    GenerationRequest,
    NotFound,
    QueryFailed,
    Rejected,
)

#: header our relays and the callbacks route use for a shared-secret token, where the vendor signs nothing.
CALLBACK_TOKEN_HEADER = "x-aivedio-callback-token"
#: query parameter that carries the same token in a callback URL we hand to a vendor (Kling).
CALLBACK_TOKEN_PARAM = "aivedio_token"
MAX_CALLBACK_BYTES = 1024 * 1024


def header(headers: Mapping[str, str], name: str) -> str | None:
    wanted = name.lower()
    for key, value in headers.items():
        if isinstance(key, str) and key.lower() == wanted:
            return value
    return None


def json_object(body: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None: vendors' error pages are not always JSON."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def response_date(headers: Mapping[str, str]) -> datetime | None:
    raw = header(headers, "date")
    if not raw:
        return None
    try:
        parsed = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Retry-After as seconds: delta-seconds, or an HTTP date measured against the response's own Date header."""
    raw = header(headers, "retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        value = float(raw)
    except ValueError:
        value = None
    if value is not None:
        return value if math.isfinite(value) and value >= 0 else None
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    reference = response_date(headers)
    if reference is None:
        return None  # no clock of the vendor's to measure against; ours may be skewed
    when = when if when.tzinfo else when.replace(tzinfo=UTC)
    return max(0.0, (when - reference).total_seconds())


def parse_iso(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def from_epoch_ms(value: Any) -> datetime | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        ms = float(value)
        return datetime.fromtimestamp(ms / 1000, UTC)
    except (ValueError, OverflowError, OSError):
        return None


def plus(base: datetime | None, seconds: int | None) -> datetime | None:
    return base + timedelta(seconds=seconds) if base is not None and seconds is not None else None


# --- sending ---------------------------------------------------------------------------------------------------


def send_submit(http: HttpClient, method: str, url: str, **kwargs: Any) -> Response | Rejected | Ambiguous:
    try:
        return http.request(method, url, **kwargs)
    except NotSent as exc:
        return Rejected(ErrorClass.CONNECT_FAILED, code="connect_failed", message=str(exc))
    except SentUnknown as exc:
        return Ambiguous(f"no answer after the request was sent ({exc})")


def send_query(http: HttpClient, method: str, url: str, **kwargs: Any) -> Response | QueryFailed:
    try:
        return http.request(method, url, **kwargs)
    except (NotSent, SentUnknown) as exc:  # a read is safe to repeat either way
        return QueryFailed(ErrorClass.QUERY_FAILED, f"transport: {exc}")


def reject_submit(
    resp: Response,
    *,
    code: str | None = None,
    message: str | None = None,
    error_class: ErrorClass | None = None,
    retryable_gateway_timeout: bool = False,
) -> Rejected | Ambiguous:
    """Classify a non-2xx answer to a create call. `error_class` overrides the status-based guess."""
    status = resp.status
    if status == 504 and not retryable_gateway_timeout and error_class is None:
        return Ambiguous(f"HTTP 504 from the vendor's gateway: the job may exist ({code or 'no code'})")
    if error_class is None:
        if status == 429:
            error_class = ErrorClass.PROVIDER_RATE_LIMITED
        elif status >= 500:
            error_class = ErrorClass.PROVIDER_5XX_NOT_ACCEPTED
        else:
            error_class = ErrorClass.PROVIDER_REJECTED
    return Rejected(
        error_class, code=code or f"http_{status}", message=message, retry_after_s=retry_after_s(resp.headers)
    )


def query_failure(resp: Response, message: str | None = None) -> NotFound | QueryFailed:
    if resp.status == 404:
        return NotFound()
    return QueryFailed(ErrorClass.QUERY_FAILED, message or f"HTTP {resp.status}", retry_after_s(resp.headers))


def error_text(body: dict[str, Any] | None, *keys: str) -> str | None:
    """The first string found under `keys` (a nested {"message": …} counts), for error messages."""
    if not body:
        return None
    for key in keys:
        value = body.get(key)
        if isinstance(value, dict):
            value = value.get("message") or value.get("detail")
        if isinstance(value, str) and value:
            return value[:500]
        if isinstance(value, list) and value:
            return json.dumps(value)[:500]
    return None


# --- callbacks ---------------------------------------------------------------------------------------------------


def callback_json(raw_body: bytes) -> dict[str, Any]:
    if not isinstance(raw_body, bytes | bytearray):
        raise CallbackRejected("body must be raw bytes")
    if len(raw_body) > MAX_CALLBACK_BYTES:
        raise CallbackRejected("body too large")
    try:
        value = json.loads(bytes(raw_body).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise CallbackRejected("body is not UTF-8 JSON") from None
    if not isinstance(value, dict):
        raise CallbackRejected("body is not a JSON object")
    return value


def secret_values(secrets: Iterable[SecretStr]) -> list[str]:
    values = [s.get_secret_value() for s in secrets]
    return [v for v in values if v]


def binding_token(secret: str, binding: str) -> str:
    """A callback token bound to one job: a leaked callback URL can forge events for that job only."""
    return hmac.new(secret.encode(), binding.encode(), hashlib.sha256).hexdigest()


def check_token(headers: Mapping[str, str], secrets: Iterable[SecretStr], binding: str | None) -> None:
    """Accept only a configured shared secret (binding None) or a token bound to `binding`; else reject."""
    keys = secret_values(secrets)
    if not keys:
        raise CallbackRejected("no callback secret configured", Reason.NOT_CONFIGURED)
    presented = header(headers, CALLBACK_TOKEN_HEADER)
    if not presented or len(presented) > 256:
        raise CallbackRejected("missing callback token", Reason.SIGNATURE)
    matched = False
    for key in keys:
        expected = key if binding is None else binding_token(key, binding)
        matched |= hmac.compare_digest(expected.encode(), presented.strip().encode())
    if not matched:
        raise CallbackRejected("callback token does not match", Reason.SIGNATURE)


# --- capabilities ------------------------------------------------------------------------------------------------


def capabilities(
    settings: ProviderSettings,
    *,
    default_max_duration_s: int,
    default_resolutions: tuple[str, ...],
    supports_callbacks: bool,
    supports_lookup_by_request_key: bool,
    supports_cancel: bool,
    output_url_ttl_s: int | None,
    cancel_is_billed: bool = True,
    model_limits: Callable[[str], ModelLimits] | None = None,
) -> Capabilities:
    models = settings.models
    resolutions = sorted({r for m in models.values() for r in m.resolutions}) or list(default_resolutions)
    return Capabilities(
        models=tuple(models),
        max_duration_s=max((m.max_duration_s for m in models.values()), default=default_max_duration_s),
        resolutions=tuple(resolutions),
        supports_callbacks=supports_callbacks,
        supports_lookup_by_request_key=supports_lookup_by_request_key,
        supports_cancel=supports_cancel,
        output_url_ttl_s=output_url_ttl_s,
        cancel_is_billed=cancel_is_billed,
        model_limits={m: model_limits(m) for m in models} if model_limits else {},
    )


def over_limits(request: GenerationRequest, limits: ModelLimits) -> Rejected | None:
    """The create step checked the request already; one that still breaks a limit (settings changed since) is
    refused before it is sent, never trimmed: dropping a reference would bill a video nobody asked for."""
    try:
        # the configured maximum was applied at create; here only the vendor's own set counts
        check_shape(request.model, limits, 2**31, request.duration_s, request.aspect_ratio)
        check_counts(request.model, limits, len(request.reference_urls), len(request.reference_video_urls))
    except LimitExceeded as exc:
        return Rejected(ErrorClass.LOCAL_INVALID, code="reference_limit", message=str(exc))
    return None


def client_for(settings: ProviderSettings, default_base_url: str, http: HttpClient | None) -> HttpClient:
    return http if http is not None else HttpClient(base_url=settings.base_url or default_base_url)
