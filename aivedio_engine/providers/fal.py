"""fal adapter (queue.fal.run, the queue API).

What fal's documentation says, and where:
- Submit `POST https://queue.fal.run/{model id}` with the model's input as the JSON body, `Authorization: Key
  <key>`; the webhook URL goes in the `fal_webhook` query parameter. The answer carries `request_id` (the id the
  queue API uses) and `gateway_request_id` (the last internal try; differs after fal retried), plus
  `status_url`, `response_url`, `cancel_url` (docs.fal.ai/model-endpoints/webhooks; fal.ai/docs/api-reference/
  inference-api; docs.rs crate `fal` queue.rs).
- "The status, result, and cancel URLs use only the owner and the app" of the model id: `GET
  /{owner}/{app}/requests/{id}/status` answers 202 while IN_QUEUE (with `queue_position`) or IN_PROGRESS and 200
  when COMPLETED; `GET /{owner}/{app}/requests/{id}` is the result; `PUT …/requests/{id}/cancel` removes a queued
  request or signals a running one, results CANCELLATION_REQUESTED / ALREADY_COMPLETED / NOT_FOUND
  (fal.ai/docs/api-reference/inference-api; fal.ai/docs/inference-api/queue/cancel; docs.fal.ai/documentation/
  development/handle-cancellations).
- The queue retries up to 10 times on 503/504/connection errors/429; "Failed requests that return 5xx status
  codes are not billed"; failed requests carry `error_type` and an `X-Fal-Error-Type` header (request_timeout,
  runner_disconnected, …) (docs.fal.ai/model-apis/model-endpoints/reliability; fal.ai/docs/documentation/
  model-apis/request-errors).
- Webhook body `{request_id, gateway_request_id, status: OK | ERROR, payload, error, payload_error}`; `payload`
  is null with a `payload_error` when the result was not JSON-serialisable; retried 10 times over 2 hours
  (docs.fal.ai/model-apis/model-endpoints/webhooks).
- Webhook signature: ed25519 over `{X-Fal-Webhook-Request-Id}\\n{X-Fal-Webhook-User-Id}\\n
  {X-Fal-Webhook-Timestamp}\\n{hex sha256 of the raw body}`, hex-encoded in `X-Fal-Webhook-Signature`, public
  keys published as a JWKS (OKP/Ed25519) at `https://rest.alpha.fal.ai/.well-known/jwks.json`; reject timestamps
  outside ±5 min (docs.fal.ai "Verifying Your Webhook", as quoted by hooklistener.com's fal guide and by several
  public verifiers found with the code search). We take the public keys from `webhook_secrets` (each a base64
  or base64url raw 32-byte key, or a JWK/JWKS JSON string): fetching the JWKS at callback time would put a
  network call, and its failures, inside the callback route.

Not documented, so [inference]:
- No idempotency key or client reference exists: `find` is Unsupported.
- The job id is `request_id` (what the webhook names). Status/result/cancel need the model's owner/app, which a
  job id alone does not carry, so the adapter tries the apps of the configured models in turn (one request when
  a provider entry serves one app) and answers NotFound only when every app says 404.
- A COMPLETED request's result endpoint replays the runner's answer: a JSON error body with a status ≥ 400 is
  the job's failure (billed=False when ≥ 500); a non-JSON error is fal's own trouble and a QueryFailed.
- The webhook's `error` reads "Invalid status code: NNN"; NNN ≥ 500 is taken as "not billed".
- Output URL lifetime is not documented: `output_url_ttl_s` from settings, counted from the response's Date.
- Model inputs (`prompt`, `duration` as a string, `aspect_ratio`, `resolution`, `seed`, `image_url`) follow
  fal's common video endpoints; each model's schema is its own.
- References: the model id says what the endpoint takes. Ids with `video-to-video` take the source clip as
  `video_url` (fal's Wan / LTX video-to-video endpoints) and need one; Kling endpoints (`kling-video`) take
  `image_url` + `tail_image_url`, 5/10 s, 16:9 / 9:16 / 1:1; Veo 3 endpoints (`veo3`) take `image_url`,
  `duration` as "4s" | "6s" | "8s", 16:9 / 9:16; any other takes one `image_url`. fal documents "input images
  up to 8MB" for Veo (fal.ai/models/fal-ai/veo2/image-to-video): we hold every fal image to 8 MB and every video
  to 32 MB (Runway's video limit; fal names none).
- CANCELLATION_REQUESTED on a running request is a request the app may ignore; we answer Canceled and let the
  status poll confirm. Time a running request used before the cancel is assumed billed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from aivedio_engine.config import ProviderSettings
from aivedio_engine.domain.references import MB, ModelLimits
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.domain.status import CallbackRejectReason as Reason
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
    SubmitResult,
    TooLate,
    Unsupported,
    units_to_seconds,
)
from aivedio_engine.providers.webhooks import DEFAULT_TOLERANCE_S

DEFAULT_BASE_URL = "https://queue.fal.run"
_HEX = re.compile(r"[0-9a-fA-F]{128}")
_TIMESTAMP = re.compile(r"[0-9]{1,11}")
_STATUS_CODE = re.compile(r"status code:?\s*(\d{3})", re.IGNORECASE)
QUEUE_STATUSES = {"IN_QUEUE": JobStatus.QUEUED, "IN_PROGRESS": JobStatus.RUNNING}
IMAGE_BYTES, VIDEO_BYTES = 8 * MB, 32 * MB
VIDEO_TO_VIDEO = ModelLimits(1, 1, 1, IMAGE_BYTES, VIDEO_BYTES)
KLING = ModelLimits(2, 0, 0, IMAGE_BYTES, 0, ("16:9", "9:16", "1:1"), (5, 10), (0.4, 2.5))
VEO = ModelLimits(1, 0, 0, IMAGE_BYTES, 0, ("16:9", "9:16"), (4, 6, 8))
DEFAULT = ModelLimits(1, 0, 0, IMAGE_BYTES, 0)


def model_limits(model: str) -> ModelLimits:
    if "video-to-video" in model:
        return VIDEO_TO_VIDEO
    if "kling-video" in model:
        return KLING
    if "/veo3" in model:
        return VEO
    return DEFAULT


class FalProvider:
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
        self._apps = list(dict.fromkeys(_app(m) for m in settings.models))
        self.capabilities = v.capabilities(
            settings,
            default_max_duration_s=10,
            default_resolutions=("720p",),
            supports_callbacks=True,
            supports_lookup_by_request_key=False,
            supports_cancel=True,
            output_url_ttl_s=settings.output_url_ttl_s,
            model_limits=model_limits,
        )

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Key {self._settings.api_key.get_secret_value()}"}

    def submit(self, request: GenerationRequest, request_key: str) -> SubmitResult:
        # request_key has nowhere to go: fal's queue takes no idempotency key or client reference.
        limits = model_limits(request.model)
        refused = v.over_limits(request, limits)
        if refused is not None:
            return refused
        body: dict[str, Any] = {
            "prompt": request.prompt,
            "duration": f"{request.duration_s}s" if limits is VEO else str(request.duration_s),
            "aspect_ratio": request.aspect_ratio,
            "resolution": request.resolution,
        }
        if request.seed is not None:
            body["seed"] = request.seed
        body.update(zip(("image_url", "tail_image_url"), request.reference_urls, strict=False))
        if request.reference_video_urls:
            body["video_url"] = request.reference_video_urls[0]
        params = {"fal_webhook": request.callback_url} if request.callback_url else None
        resp = v.send_submit(self._http, "POST", f"/{request.model}", json=body, params=params, headers=self._headers())
        if not isinstance(resp, Response):
            return resp
        data = v.json_object(resp.body)
        if 200 <= resp.status < 300:
            job_id = data.get("request_id") if data else None
            if not isinstance(job_id, str) or not job_id:
                return Ambiguous(f"HTTP {resp.status} without a request_id")
            return Accepted(job_id, Observation(job_id=job_id, status=JobStatus.QUEUED, raw=data or {}))
        return v.reject_submit(
            resp, code=v.header(resp.headers, "x-fal-error-type"), message=v.error_text(data, "detail", "error")
        )

    def query(self, job_id: str) -> Observation | NotFound | QueryFailed:
        for app in self._apps:
            resp = v.send_query(self._http, "GET", f"/{app}/requests/{job_id}/status", headers=self._headers())
            if not isinstance(resp, Response):
                return resp
            if resp.status == 404:
                continue
            if resp.status not in (200, 202):
                return v.query_failure(resp)
            status = v.json_object(resp.body)
            if status is None:
                return QueryFailed(ErrorClass.QUERY_FAILED, "status body is not a JSON object")
            return self._from_status(app, job_id, status, v.response_date(resp.headers))
        if not self._apps:
            return QueryFailed(ErrorClass.QUERY_FAILED, "no fal model configured: cannot build the status URL")
        return NotFound()

    def _from_status(
        self, app: str, job_id: str, status: dict[str, Any], seen_at: datetime | None
    ) -> Observation | QueryFailed:
        name = status.get("status")
        if name in QUEUE_STATUSES:
            return Observation(job_id=job_id, status=QUEUE_STATUSES[name], raw={"status": status})
        if name != "COMPLETED":
            return QueryFailed(ErrorClass.QUERY_FAILED, f"unknown fal status {name!r}")
        if status.get("error"):
            return Observation(
                job_id=job_id,
                status=JobStatus.FAILED,
                error_code=_str(status.get("error_type")),
                error_message=_str(status.get("error")),
                raw={"status": status},
            )
        resp = v.send_query(self._http, "GET", f"/{app}/requests/{job_id}", headers=self._headers())
        if not isinstance(resp, Response):
            return resp
        result = v.json_object(resp.body)
        if resp.status == 200 and result is not None:
            return self._succeeded(
                job_id, result, v.response_date(resp.headers) or seen_at, raw={"status": status, "result": result}
            )
        if resp.status >= 400 and result is not None and "detail" in result:
            return Observation(
                job_id=job_id,
                status=JobStatus.FAILED,
                error_code=v.header(resp.headers, "x-fal-error-type")
                or _str(result.get("error_type"))
                or f"http_{resp.status}",
                error_message=v.error_text(result, "detail"),
                billed=False if resp.status >= 500 else None,
                raw={"status": status, "result": result},
            )
        failure = v.query_failure(resp, f"result fetch: HTTP {resp.status}")
        return failure if isinstance(failure, QueryFailed) else QueryFailed(ErrorClass.QUERY_FAILED, "result gone")

    def _succeeded(
        self, job_id: str, payload: Any, minted: datetime | None, raw: dict[str, Any], event_id: str | None = None
    ) -> Observation:
        expires = v.plus(minted, self._settings.output_url_ttl_s)
        outputs = tuple(
            Output(
                url=f["url"],
                expires_at=expires,
                content_type=_str(f.get("content_type")),
                size_bytes=f.get("file_size") if isinstance(f.get("file_size"), int) else None,
                index=i,
            )
            for i, f in enumerate(_files(payload))
        )
        # the status body's `metrics.inference_time` (seconds the runner worked; the webhook does not carry it):
        # recorded as the vendor's figure, priced as output seconds only with the provider's configured rate
        status = raw.get("status")
        metrics = status.get("metrics") if isinstance(status, dict) else None
        took = metrics.get("inference_time") if isinstance(metrics, dict) else None
        compute = float(took) if isinstance(took, int | float) and not isinstance(took, bool) and took >= 0 else None
        return Observation(
            job_id=job_id,
            status=JobStatus.SUCCEEDED,
            outputs=outputs,
            billed=True,
            vendor_cost=compute,
            billed_seconds=units_to_seconds(compute, self._settings.vendor_unit_seconds),
            event_id=event_id,
            raw=raw,
        )

    def find(self, request_key: str) -> Unsupported:
        return Unsupported()

    def list_jobs(self, created_after: datetime, created_before: datetime) -> Unsupported:
        return Unsupported()

    def cancel(self, job_id: str) -> Canceled | TooLate | Unsupported | QueryFailed:
        for app in self._apps:
            resp = v.send_query(self._http, "PUT", f"/{app}/requests/{job_id}/cancel", headers=self._headers())
            if not isinstance(resp, Response):
                return resp
            outcome = (v.json_object(resp.body) or {}).get("status")
            if outcome == "ALREADY_COMPLETED":
                return TooLate()
            if resp.status == 404 or outcome == "NOT_FOUND":
                continue
            if 200 <= resp.status < 300:
                return Canceled()
            failure = v.query_failure(resp)
            return failure if isinstance(failure, QueryFailed) else QueryFailed(ErrorClass.QUERY_FAILED, "gone")
        return QueryFailed(ErrorClass.QUERY_FAILED, "request not found in any configured fal app")

    def parse_callback(self, headers: Mapping[str, str], raw_body: bytes, now: datetime) -> list[Observation]:
        request_id = self._verify(headers, raw_body, now)
        data = v.callback_json(raw_body)
        if data.get("request_id") != request_id:
            raise CallbackRejected("body request_id differs from the signed header", Reason.SIGNATURE)
        outcome = data.get("status")
        event_id = f"{request_id}:{outcome}"
        if outcome == "OK":
            return [self._succeeded(request_id, data.get("payload"), now, raw=data, event_id=event_id)]
        if outcome == "ERROR":
            error = _str(data.get("error"))
            payload = data.get("payload") if isinstance(data.get("payload"), dict) else None
            match = _STATUS_CODE.search(error or "")
            code = int(match.group(1)) if match else None
            return [
                Observation(
                    job_id=request_id,
                    status=JobStatus.FAILED,
                    error_code=f"http_{code}" if code else None,
                    error_message=error or v.error_text(payload, "detail"),
                    billed=False if code and code >= 500 else None,
                    event_id=event_id,
                    raw=data,
                )
            ]
        raise CallbackRejected(f"unknown webhook status {outcome!r}")

    def _verify(self, headers: Mapping[str, str], raw_body: bytes, now: datetime) -> str:
        names = (
            "x-fal-webhook-request-id",
            "x-fal-webhook-user-id",
            "x-fal-webhook-timestamp",
            "x-fal-webhook-signature",
        )
        request_id, user_id, ts, sig_hex = (v.header(headers, n) for n in names)
        if not (request_id and user_id and ts and sig_hex):
            raise CallbackRejected("missing X-Fal-Webhook-* headers", Reason.SIGNATURE)
        if not _TIMESTAMP.fullmatch(ts) or not _HEX.fullmatch(sig_hex):
            raise CallbackRejected("malformed X-Fal-Webhook-* headers", Reason.SIGNATURE)
        now_s = (now if now.tzinfo else now.replace(tzinfo=UTC)).timestamp()
        if abs(int(ts) - now_s) > self._tolerance_s:
            raise CallbackRejected("webhook timestamp outside the tolerance", Reason.TIMESTAMP)
        if not isinstance(raw_body, bytes | bytearray):
            raise CallbackRejected("body must be raw bytes")
        digest = hashlib.sha256(bytes(raw_body)).hexdigest()
        message = f"{request_id}\n{user_id}\n{ts}\n{digest}".encode()
        keys = _public_keys(v.secret_values(self._settings.webhook_secrets))
        if not keys:
            raise CallbackRejected("no usable fal public key configured", Reason.NOT_CONFIGURED)
        try:
            from cryptography.exceptions import InvalidSignature
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        except ImportError:  # no honest way to check the signature: refuse rather than accept unverified
            raise CallbackRejected(
                "ed25519 verification unavailable (cryptography not installed)", Reason.NOT_CONFIGURED
            ) from None
        signature = bytes.fromhex(sig_hex)
        for raw_key in keys:
            try:
                Ed25519PublicKey.from_public_bytes(raw_key).verify(signature, message)
                return request_id
            except (InvalidSignature, ValueError):
                continue
        raise CallbackRejected("no fal public key verifies the signature", Reason.SIGNATURE)


def _public_keys(secrets: list[str]) -> list[bytes]:
    keys: list[bytes] = []
    for secret in secrets:
        text = secret.strip()
        if text.startswith("{"):
            try:
                doc = json.loads(text)
            except ValueError:
                continue
            jwks = doc.get("keys", [doc]) if isinstance(doc, dict) else []
            candidates = [k.get("x", "") for k in jwks if isinstance(k, dict) and k.get("crv") == "Ed25519"]
        else:
            candidates = [text]
        for candidate in candidates:
            raw = _b64(candidate)
            if raw is not None and len(raw) == 32:
                keys.append(raw)
    return keys


def _b64(text: str) -> bytes | None:
    padded = text + "=" * (-len(text) % 4)
    try:
        return base64.urlsafe_b64decode(padded) if ("-" in text or "_" in text) else base64.b64decode(padded)
    except (binascii.Error, ValueError):
        return None


def _files(payload: Any) -> list[dict[str, Any]]:
    """Files in a result: `video` / `videos` first (video endpoints), else any top-level {url} objects."""
    if not isinstance(payload, dict):
        return []

    def collect(value: Any) -> list[dict[str, Any]]:
        if isinstance(value, dict) and isinstance(value.get("url"), str):
            return [value]
        if isinstance(value, list):
            return [f for item in value for f in collect(item)]
        return []

    preferred = collect(payload.get("video")) + collect(payload.get("videos"))
    return preferred or [f for key, value in payload.items() for f in collect(value)]


def _app(model: str) -> str:
    return "/".join(model.strip("/").split("/")[:2])


def _str(value: Any) -> str | None:
    return value[:500] if isinstance(value, str) and value else None
