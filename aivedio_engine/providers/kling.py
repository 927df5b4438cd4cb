"""Kling adapter (api-singapore.klingai.com, the official Kling AI API).

What Kling's documentation says, and where:
- Domain `https://api-singapore.klingai.com` (moved from api.klingai.com). Auth: a JWT (RFC 7519, HS256)
  signed with the SecretKey, payload `{iss: AccessKey, exp: now + 1800, nbf: now - 5}`, sent as
  `Authorization: Bearer <token>` (Kling "General Information", apiReference/commonInfo, as mirrored at
  …/kling-api/pages/apiReference_commonInfo.html; the same code in klingai skills on tessl.io). We read the pair
  from `api_key` as "ACCESS_KEY:SECRET_KEY".
- `POST /v1/videos/text2video` {model_name, prompt, negative_prompt, duration "5"|"10", aspect_ratio, mode
  std|pro, callback_url, external_task_id} and `POST /v1/videos/image2video` {…, image}; answer
  `{code: 0, message, request_id, data: {task_id, task_status, task_info: {external_task_id}, created_at,
  updated_at}}` (a public client's recorded text2video request/response logs, youtube-automation
  logs/requests/*_text2video.json; Liml-info/Media_main FE/src/types/TextToVideoRequest.d.ts).
- `external_task_id` is "customer-defined"; "query the video using this custom ID when needed" (Kling API
  Specification changelog 2024-11-15, docs.qingque.cn) — the query endpoint takes `task_id` or
  `external_task_id`, "choose one of the two" (docs.kkiai.com mirror of "Query Task (Single)").
- Statuses `submitted | processing | succeed | failed`; `task_status_msg` gives the failure reason.
- Callback protocol: POSTed to `callback_url` on every status change: `{task_id, task_status, task_status_msg,
  created_at, updated_at (ms), final_unit_deduction, task_info: {external_task_id}, task_result: {videos:
  [{id, url, duration}]}}`; generated media "will be cleared after 30 days" (apiReference/callbackProtocol
  mirror).
- Error codes (HTTP / service code): 401 / 1000–1004 authentication; 429 / 1100–1102 account exception,
  arrears, resource pack depleted (commonInfo mirror). From the same table as recalled, not re-read: 400 /
  1200–1201 bad parameters, 404 / 1203 resource does not exist, 400 / 1300–1301 platform and content policy,
  429 / 1302 rate limit, 429 / 1303 concurrency over the resource pack, 429 / 1304 IP whitelist, 500 / 5000,
  503 / 5001 maintenance, 504 / 5002 internal timeout. A 429 is therefore not always "slow down": 1100–1103
  and 1304 are account or configuration faults and are not retried.

- References: image2video takes `image` (first frame) and, on models with end-frame control, `image_tail`; an
  image must be ≤ 10 MB, ≥ 300 px each side, width/height between 1:2.5 and 2.5:1; durations 5 or 10 s; aspect
  ratios 16:9, 9:16, 1:1 (Kling image-to-video parameter tables as republished by novita.ai, jiekou.ai and
  myrouter.ai for kling-v2.5/v2.6/v3; open-route-api.fashionlabs.cn for `image_tail`). Kling has no
  video-to-video from a URL (its video extension takes a Kling video id), so video references are refused.

Not documented, so [inference]:
- Which models take `image_tail`: kling-v1-5 and kling-v1-6 (end-frame control in Kling's capability map as
  recalled, not re-read); every other model is held to one image. A model that refuses the tail answers 400,
  a final rejection that bills nothing.
- No callback signature is documented. We accept a callback only with a token bound to the job: submit adds
  `aivedio_token=HMAC-SHA256(webhook_secrets[0], external_task_id)` to the callback URL, and the callbacks route
  must hand that query parameter to `parse_callback` as the `X-Aivedio-Callback-Token` header; any configured
  secret is accepted (rotation). A leaked callback URL can forge events for one job only.
- Lookup by request key sends `external_task_id` as a query parameter (`GET /v1/videos/{kind}?external_task_id=`),
  as public clients do; the answer may be one task or a list, and only a task whose `task_info.external_task_id`
  equals the key counts.
- The job id is Kling's `task_id`, which does not say whether it is a text2video or image2video task, so
  query/find try text2video, then image2video, on "not found" (HTTP 404 or service code 1203).
- 5002 (server internal timeout on create) is Ambiguous: the task may exist; `find` settles it. Where Kling's
  own service answers with a code, the code decides, not the HTTP status (a 504 carrying 5001 is "not created").
- No cancel endpoint is documented: `cancel` is Unsupported.
- `mode` is "pro" for 1080p, else "std"; seeds are not part of Kling's create body and are dropped.
- The 30 days of retention are counted from `created_at`; `final_unit_deduction` > 0 means billed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from aivedio_engine.clock import Clock, SystemClock
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
    units_to_seconds,
)

DEFAULT_BASE_URL = "https://api-singapore.klingai.com"
OUTPUT_URL_TTL_S = 30 * 24 * 3600
TOKEN_TTL_S = 1800
KINDS = ("text2video", "image2video")
NOT_FOUND_CODES = {1203}
STATUSES = {
    "submitted": JobStatus.QUEUED,
    "processing": JobStatus.RUNNING,
    "succeed": JobStatus.SUCCEEDED,
    "failed": JobStatus.FAILED,
}

ASPECTS = ("16:9", "9:16", "1:1")
ONE_FRAME = ModelLimits(1, 0, 0, 10 * MB, 0, ASPECTS, (5, 10), (0.4, 2.5))
FIRST_AND_LAST = ModelLimits(2, 0, 0, 10 * MB, 0, ASPECTS, (5, 10), (0.4, 2.5))
TAIL_MODELS = {"kling-v1-5", "kling-v1-6"}


def model_limits(model: str) -> ModelLimits:
    return FIRST_AND_LAST if model in TAIL_MODELS else ONE_FRAME


def error_class(service_code: int | None) -> ErrorClass | None:
    """Kling's service code decides where the HTTP status would mislead (a 429 that is an empty account)."""
    if service_code is None:
        return None
    if 1100 <= service_code <= 1103 or service_code == 1304:
        return ErrorClass.PROVIDER_REJECTED
    if service_code in (1302, 1303):
        return ErrorClass.PROVIDER_RATE_LIMITED
    if service_code in (5000, 5001):
        return ErrorClass.PROVIDER_5XX_NOT_ACCEPTED
    return None


class KlingProvider:
    def __init__(
        self, name: str, settings: ProviderSettings, http: HttpClient | None = None, *, clock: Clock | None = None
    ) -> None:
        self.name = name
        self._settings = settings
        self._http = v.client_for(settings, DEFAULT_BASE_URL, http)
        self._clock = clock or SystemClock()
        self.capabilities = v.capabilities(
            settings,
            default_max_duration_s=10,
            default_resolutions=("720p", "1080p"),
            supports_callbacks=True,
            supports_lookup_by_request_key=settings.supports_lookup_by_request_key,
            supports_cancel=False,
            output_url_ttl_s=OUTPUT_URL_TTL_S,
            model_limits=model_limits,
        )

    def _headers(self) -> dict[str, str] | None:
        access_key, sep, secret_key = self._settings.api_key.get_secret_value().partition(":")
        if not (sep and access_key and secret_key):
            return None
        now = int(self._clock.now().timestamp())
        return {"Authorization": f"Bearer {jwt_hs256(access_key, secret_key, now)}"}

    def submit(self, request: GenerationRequest, request_key: str) -> SubmitResult:
        headers = self._headers()
        if headers is None:
            return Rejected(
                ErrorClass.LOCAL_INVALID, code="bad_api_key", message="Kling api_key must be ACCESS_KEY:SECRET_KEY"
            )
        refused = v.over_limits(request, model_limits(request.model))
        if refused is not None:
            return refused
        kind = "image2video" if request.reference_urls else "text2video"
        body: dict[str, Any] = {
            "model_name": request.model,
            "prompt": request.prompt,
            "duration": str(request.duration_s),
            "mode": "pro" if request.resolution == "1080p" else "std",
            "external_task_id": request_key,
        }
        if request.reference_urls:
            body["image"] = request.reference_urls[0]
            if len(request.reference_urls) > 1:
                body["image_tail"] = request.reference_urls[1]
        else:
            body["aspect_ratio"] = request.aspect_ratio
        if request.callback_url:
            body["callback_url"] = self._callback_url(request.callback_url, request_key)
        resp = v.send_submit(self._http, "POST", f"/v1/videos/{kind}", json=body, headers=headers)
        if not isinstance(resp, Response):
            return resp
        data = v.json_object(resp.body)
        code = _service_code(data)
        if 200 <= resp.status < 300 and code in (0, None):
            task = data.get("data") if data else None
            job_id = task.get("task_id") if isinstance(task, dict) else None
            if not isinstance(task, dict) or not isinstance(job_id, str) or not job_id:
                return Ambiguous(f"HTTP {resp.status} without a task_id")
            obs = self._observe(task, job_id, event_id=None)
            return Accepted(job_id, obs if isinstance(obs, Observation) else None)
        if code == 5002:  # "server internal timeout": the task may have been created
            return Ambiguous(f"Kling 5002 (internal timeout) on HTTP {resp.status}: the task may exist")
        return v.reject_submit(
            resp,
            code=f"kling_{code}" if code is not None else None,
            message=v.error_text(data, "message"),
            error_class=error_class(code),
        )

    def _callback_url(self, url: str, request_key: str) -> str:
        secrets = v.secret_values(self._settings.webhook_secrets)
        if not secrets:
            return url
        token = v.binding_token(secrets[0], request_key)
        return f"{url}{'&' if '?' in url else '?'}{urlencode({v.CALLBACK_TOKEN_PARAM: token})}"

    def query(self, job_id: str) -> Observation | NotFound | QueryFailed:
        return self._lookup(lambda kind: (f"/v1/videos/{kind}/{job_id}", None), job_id, request_key=None)

    def find(self, request_key: str) -> Observation | NotFound | Unsupported | QueryFailed:
        if not self.capabilities.supports_lookup_by_request_key:
            return Unsupported()
        return self._lookup(
            lambda kind: (f"/v1/videos/{kind}", {"external_task_id": request_key}), None, request_key=request_key
        )

    def _lookup(
        self, route: Callable[[str], tuple[str, dict[str, str] | None]], job_id: str | None, request_key: str | None
    ) -> Observation | NotFound | QueryFailed:
        headers = self._headers()
        if headers is None:
            return QueryFailed(ErrorClass.QUERY_FAILED, "Kling api_key must be ACCESS_KEY:SECRET_KEY")
        for kind in KINDS:
            path, params = route(kind)
            resp = v.send_query(self._http, "GET", path, params=params, headers=headers)
            if not isinstance(resp, Response):
                return resp
            data = v.json_object(resp.body)
            code = _service_code(data)
            if resp.status == 404 or code in NOT_FOUND_CODES:
                continue
            if resp.status != 200 or code not in (0, None):
                failure = v.query_failure(resp, f"HTTP {resp.status}, Kling code {code}")
                return failure if isinstance(failure, QueryFailed) else QueryFailed(ErrorClass.QUERY_FAILED)
            task = _pick(data.get("data") if data else None, request_key)
            if task is None:
                continue
            task_id = task.get("task_id")
            if not isinstance(task_id, str) or not task_id:
                return QueryFailed(ErrorClass.QUERY_FAILED, "task without a task_id")
            return self._observe(task, job_id or task_id, event_id=None)
        return NotFound()

    def list_jobs(self, created_after: datetime, created_before: datetime) -> Unsupported:
        return Unsupported()

    def cancel(self, job_id: str) -> Canceled | TooLate | Unsupported | QueryFailed:
        return Unsupported()

    def parse_callback(self, headers: Mapping[str, str], raw_body: bytes, now: datetime) -> list[Observation]:
        data = v.callback_json(raw_body)
        info = data.get("task_info")
        key = info.get("external_task_id") if isinstance(info, dict) else None
        if not isinstance(key, str) or not key:
            raise CallbackRejected("callback without task_info.external_task_id: not one of ours")
        v.check_token(headers, self._settings.webhook_secrets, binding=key)
        job_id = data.get("task_id")
        if not isinstance(job_id, str) or not job_id:
            raise CallbackRejected("callback without a task_id")
        event_id = f"{job_id}:{data.get('task_status')}:{data.get('updated_at')}"
        obs = self._observe(data, job_id, event_id=event_id)
        if isinstance(obs, QueryFailed):
            raise CallbackRejected(obs.message or "unreadable task")
        return [obs]

    def _observe(self, task: dict[str, Any], job_id: str, event_id: str | None) -> Observation | QueryFailed:
        status = STATUSES.get(str(task.get("task_status")))
        if status is None:
            return QueryFailed(ErrorClass.QUERY_FAILED, f"unknown Kling status {task.get('task_status')!r}")
        created = v.from_epoch_ms(task.get("created_at"))
        outputs: tuple[Output, ...] = ()
        if status is JobStatus.SUCCEEDED:
            result = task.get("task_result")
            videos = result.get("videos") if isinstance(result, dict) else None
            outputs = tuple(
                Output(url=item["url"], expires_at=v.plus(created, OUTPUT_URL_TTL_S), index=i)
                for i, item in enumerate(videos or [])
                if isinstance(item, dict) and isinstance(item.get("url"), str) and item["url"]
            )
        cost = _number(task.get("final_unit_deduction"))
        billed = cost > 0 if cost is not None else (True if status is JobStatus.SUCCEEDED else None)
        info = task.get("task_info")
        key = info.get("external_task_id") if isinstance(info, dict) else None
        message = task.get("task_status_msg")
        return Observation(
            job_id=job_id,
            status=status,
            provider_updated_at=v.from_epoch_ms(task.get("updated_at")) or created,
            outputs=outputs,
            error_message=message[:500]
            if isinstance(message, str) and message and status is JobStatus.FAILED
            else None,
            billed=billed,
            vendor_cost=cost,
            # units priced as output seconds by the provider's configured rate; unset: the price list stands
            billed_seconds=units_to_seconds(cost, self._settings.vendor_unit_seconds) if billed else None,
            request_key=key if isinstance(key, str) and key else None,
            event_id=event_id,
            raw=task,
        )


def jwt_hs256(access_key: str, secret_key: str, now: int) -> str:
    def part(obj: dict[str, Any]) -> str:
        raw = json.dumps(obj, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    claims = {"iss": access_key, "exp": now + TOKEN_TTL_S, "nbf": now - 5}  # nbf: tolerate our clock running ahead
    signing_input = f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims)}"
    signature = hmac.new(secret_key.encode(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"


def _pick(data: Any, request_key: str | None) -> dict[str, Any] | None:
    """The task in a query answer; for a lookup by key, only one that carries that key."""
    items = data if isinstance(data, list) else [data]
    for item in items:
        if not isinstance(item, dict):
            continue
        if request_key is None:
            return item
        info = item.get("task_info")
        if isinstance(info, dict) and info.get("external_task_id") == request_key:
            return item
    return None


def _service_code(data: dict[str, Any] | None) -> int | None:
    code = data.get("code") if data else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value) if isinstance(value, int | float | str) and value != "" else None
    except ValueError:
        return None
    return number if number is not None and math.isfinite(number) else None
