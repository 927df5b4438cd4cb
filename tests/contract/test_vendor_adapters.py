"""One contract suite for the four vendor adapters (runway, replicate, fal, kling).

Every adapter meets the same scenarios, fed with response shapes recorded by hand from each vendor's documentation
(`fixtures/<vendor>/*.json`, each naming its source in `_source`). The vendors differ in a few answers the suite
states per vendor: where the request key goes, whether a gateway timeout is safe to retry, how callbacks are
authenticated, how long output URLs live.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.httpclient import HttpClient
from aivedio_engine.providers.base import (
    Accepted,
    Ambiguous,
    CallbackRejected,
    Canceled,
    GenerationRequest,
    JobStatus,
    NotFound,
    Observation,
    Provider,
    QueryFailed,
    Rejected,
    TooLate,
    Unsupported,
)
from aivedio_engine.providers.fal import FalProvider
from aivedio_engine.providers.kling import KlingProvider, jwt_hs256
from aivedio_engine.providers.replicate import ReplicateProvider
from aivedio_engine.providers.runway import RunwayProvider
from aivedio_engine.providers.webhooks import new_secret
from tests.support.vendors import (
    CREATED,
    FAL_PUBLIC,
    KEY,
    KLING_SECRET,
    NOW,
    REPLICATE_SECRET,
    RUNWAY_SECRET,
    FixedClock,
    Router,
    fixture,
    reply,
    settings,
    sign_fal,
    sign_kling,
    sign_replicate,
    sign_runway,
)

# --- the vendors --------------------------------------------------------------------------------------------------

R = dict[tuple[str, str], Any]


@dataclass
class Vendor:
    name: str
    make: Callable[[HttpClient], Provider]
    model: str
    job_id: str
    submit_route: tuple[str, str]
    query_routes: Callable[[str], R]  # job id's status fixture name → routes
    not_found_routes: R
    statuses: list[tuple[R, JobStatus]]
    gateway_timeout: type
    cancels: list[tuple[R, type]]
    callback_fixture: str
    sign: Callable[..., dict[str, str]]
    succeeded_routes: R
    output_url: str
    output_expires_at: datetime
    lookup: bool
    timestamped_signature: bool  # rejects stale deliveries by itself
    wrong_secret: Callable[[bytes], dict[str, str]]
    key_in_body: bool = False
    gateway_timeout_fixture: str = "submit_server_error"


RW_ID = "a5c1e4b2-7d1f-4b0e-9c55-2f3e8d9a6b01"
RW_TASK = ("GET", f"/v1/tasks/{RW_ID}")
R_ID = "ufawqhfynnddngldkgtslldrkq"
R_GET = ("GET", f"/v1/predictions/{R_ID}")
F_ID = "024ca5b1-45d3-4afd-883e-ad3abe2a1c4d"
F_STATUS = ("GET", f"/fal-ai/kling-video/requests/{F_ID}/status")
F_RESULT = ("GET", f"/fal-ai/kling-video/requests/{F_ID}")
K_ID = "867283741759111202"
K_T2V = ("GET", f"/v1/videos/text2video/{K_ID}")
K_I2V = ("GET", f"/v1/videos/image2video/{K_ID}")

VENDORS = [
    Vendor(
        name="runway",
        make=lambda http: RunwayProvider("runway", settings("runway", "gen4_turbo", "rw_key", [RUNWAY_SECRET]), http),
        model="gen4_turbo",
        job_id=RW_ID,
        submit_route=("POST", "/v1/text_to_video"),
        query_routes=lambda name: {RW_TASK: name},
        not_found_routes={RW_TASK: "not_found"},
        statuses=[
            ({RW_TASK: f"task_{s}"}, js)
            for s, js in [
                ("PENDING", JobStatus.QUEUED),
                ("THROTTLED", JobStatus.THROTTLED),
                ("RUNNING", JobStatus.RUNNING),
                ("SUCCEEDED", JobStatus.SUCCEEDED),
                ("FAILED", JobStatus.FAILED),
                ("CANCELLED", JobStatus.CANCELED),
            ]
        ],
        gateway_timeout=Rejected,  # Runway documents 504 as safe to retry
        cancels=[
            ({RW_TASK: "task_RUNNING", ("DELETE", RW_TASK[1]): "cancel_deleted"}, Canceled),
            ({RW_TASK: "task_SUCCEEDED"}, TooLate),
        ],
        callback_fixture="callback_task",
        sign=sign_runway,
        succeeded_routes={RW_TASK: "task_SUCCEEDED"},
        output_url="https://dnznrvs05pmza.cloudfront.net/output.mp4?_jwt=eyJhbGciOi",
        output_expires_at=NOW + timedelta(hours=24),
        lookup=False,
        timestamped_signature=False,
        wrong_secret=lambda body: sign_runway(body, secret="not-the-secret"),
    ),
    Vendor(
        name="replicate",
        make=lambda http: ReplicateProvider(
            "replicate", settings("replicate", "acme/video-model", "r8_key", [REPLICATE_SECRET]), http
        ),
        model="acme/video-model",
        job_id=R_ID,
        submit_route=("POST", "/v1/models/acme/video-model/predictions"),
        query_routes=lambda name: {R_GET: name},
        not_found_routes={R_GET: "not_found"},
        statuses=[
            ({R_GET: f"prediction_{s}"}, js)
            for s, js in [
                ("starting", JobStatus.QUEUED),
                ("processing", JobStatus.RUNNING),
                ("succeeded", JobStatus.SUCCEEDED),
                ("failed", JobStatus.FAILED),
                ("canceled", JobStatus.CANCELED),
                ("aborted", JobStatus.ABORTED),
            ]
        ],
        gateway_timeout=Ambiguous,
        cancels=[
            ({("POST", f"/v1/predictions/{R_ID}/cancel"): "cancel_canceled"}, Canceled),
            ({("POST", f"/v1/predictions/{R_ID}/cancel"): "cancel_too_late"}, TooLate),
        ],
        callback_fixture="callback_prediction",
        sign=sign_replicate,
        succeeded_routes={R_GET: "prediction_succeeded"},
        output_url="https://replicate.delivery/xezq/abc123/output.mp4",
        output_expires_at=CREATED + timedelta(hours=1),
        lookup=False,
        timestamped_signature=True,
        wrong_secret=lambda body: sign_replicate(body, secret=new_secret(b"some-other-secret-of-32-bytes!!!")),
    ),
    Vendor(
        name="fal",
        make=lambda http: FalProvider(
            "fal",
            settings(
                "fal", "fal-ai/kling-video/v2/master/text-to-video", "fal_key", [FAL_PUBLIC], output_url_ttl_s=7200
            ),
            http,
        ),
        model="fal-ai/kling-video/v2/master/text-to-video",
        job_id=F_ID,
        submit_route=("POST", "/fal-ai/kling-video/v2/master/text-to-video"),
        query_routes=lambda name: {F_STATUS: name},
        not_found_routes={F_STATUS: "not_found"},
        statuses=[
            ({F_STATUS: "status_IN_QUEUE"}, JobStatus.QUEUED),
            ({F_STATUS: "status_IN_PROGRESS"}, JobStatus.RUNNING),
            ({F_STATUS: "status_COMPLETED", F_RESULT: "result_ok"}, JobStatus.SUCCEEDED),
            ({F_STATUS: "status_COMPLETED", F_RESULT: "result_server_error"}, JobStatus.FAILED),
        ],
        gateway_timeout=Ambiguous,
        cancels=[
            ({("PUT", f"{F_RESULT[1]}/cancel"): "cancel_requested"}, Canceled),
            ({("PUT", f"{F_RESULT[1]}/cancel"): "cancel_already_completed"}, TooLate),
        ],
        callback_fixture="webhook_ok",
        sign=sign_fal,
        succeeded_routes={F_STATUS: "status_COMPLETED", F_RESULT: "result_ok"},
        output_url="https://v3.fal.media/files/rabbit/abc123_output.mp4",
        output_expires_at=NOW + timedelta(seconds=7200),
        lookup=False,
        timestamped_signature=True,
        wrong_secret=lambda body: sign_fal(body, key=Ed25519PrivateKey.generate()),
    ),
    Vendor(
        name="kling",
        make=lambda http: KlingProvider(
            "kling", settings("kling", "kling-v2-master", "ak_test:sk_test", [KLING_SECRET]), http, clock=FixedClock()
        ),
        model="kling-v2-master",
        job_id=K_ID,
        submit_route=("POST", "/v1/videos/text2video"),
        query_routes=lambda name: {K_T2V: name},
        not_found_routes={K_T2V: "not_found", K_I2V: "not_found"},
        statuses=[
            ({K_T2V: f"task_{s}"}, js)
            for s, js in [
                ("submitted", JobStatus.QUEUED),
                ("processing", JobStatus.RUNNING),
                ("succeed", JobStatus.SUCCEEDED),
                ("failed", JobStatus.FAILED),
            ]
        ],
        gateway_timeout=Ambiguous,
        cancels=[({}, Unsupported)],
        callback_fixture="callback_succeed",
        sign=sign_kling,
        succeeded_routes={K_T2V: "task_succeed"},
        output_url="https://v15-kling.klingai.com/bs2/upload-ylab-stunt/abc123.mp4",
        output_expires_at=CREATED + timedelta(days=30),
        lookup=True,
        timestamped_signature=False,
        wrong_secret=lambda body: sign_kling(body, secret="not-the-secret"),
        key_in_body=True,
        gateway_timeout_fixture="submit_timeout",
    ),
]
BY_NAME = {v.name: v for v in VENDORS}


def provider(vendor: Vendor, routes: R) -> tuple[Provider, Router]:
    router = Router(vendor.name, routes)
    http = HttpClient(base_url=f"https://{vendor.name}.test", transport=httpx.MockTransport(router))
    return vendor.make(http), router


def request_for(vendor: Vendor, **overrides: Any) -> GenerationRequest:
    fields: dict[str, Any] = {
        "prompt": "a red fox in snow",
        "model": vendor.model,
        "duration_s": 5,
        "resolution": "720p",
        "aspect_ratio": "16:9",
        "callback_url": "https://hooks.example.com/v1/callbacks/x",
    }
    fields.update(overrides)
    return GenerationRequest(**fields)


def submit_with(vendor: Vendor, action: Any) -> tuple[Any, Router]:
    p, router = provider(vendor, {vendor.submit_route: action})
    return p.submit(request_for(vendor), KEY), router


def cases(build: Callable[[Vendor], list[tuple[Any, ...]]]) -> list[Any]:
    return [pytest.param(v, *case, id=f"{v.name}-{i}") for v in VENDORS for i, case in enumerate(build(v))]


vendors = pytest.mark.parametrize("vendor", VENDORS, ids=lambda v: v.name)


# --- shape and capabilities ---------------------------------------------------------------------------------------


@vendors
def test_implements_the_protocol_with_vendor_capabilities(vendor: Vendor) -> None:
    p, _ = provider(vendor, {})
    assert isinstance(p, Provider)
    caps = p.capabilities
    assert caps.models == (vendor.model,)
    assert caps.supports_lookup_by_request_key is vendor.lookup
    assert caps.max_duration_s == 10 and set(caps.resolutions) == {"720p", "1080p"}


# --- submit -------------------------------------------------------------------------------------------------------


@vendors
def test_submit_accepted_returns_the_vendor_job_id_and_places_the_request_key(vendor: Vendor) -> None:
    result, router = submit_with(vendor, "submit_accepted")
    assert isinstance(result, Accepted) and result.job_id == vendor.job_id
    (sent,) = router.calls
    assert sent.headers.get("authorization"), "every call carries the vendor's credentials"
    body = json.loads(sent.content)
    # only Kling has a place for our key (external_task_id); elsewhere it must not leak into the model input
    assert (KEY in json.dumps(body)) is vendor.key_in_body


@vendors
@pytest.mark.parametrize("name", ["submit_invalid", "submit_unauthorized"])
def test_submit_client_errors_are_final_rejections(vendor: Vendor, name: str) -> None:
    result, _ = submit_with(vendor, name)
    assert isinstance(result, Rejected) and result.error_class is ErrorClass.PROVIDER_REJECTED
    assert result.message


@vendors
def test_submit_429_is_rate_limited_with_retry_after(vendor: Vendor) -> None:
    result, _ = submit_with(vendor, "submit_rate_limited")
    assert result == Rejected(
        ErrorClass.PROVIDER_RATE_LIMITED, code=result.code, message=result.message, retry_after_s=7.0
    )


@vendors
@pytest.mark.parametrize("status", [500, 502, 503])
def test_submit_explicit_5xx_means_not_created(vendor: Vendor, status: int) -> None:
    result, _ = submit_with(vendor, reply(fixture(vendor.name, "submit_server_error"), status))
    assert isinstance(result, Rejected) and result.error_class is ErrorClass.PROVIDER_5XX_NOT_ACCEPTED


@vendors
def test_submit_gateway_timeout_follows_the_vendor_retry_guidance(vendor: Vendor) -> None:
    result, _ = submit_with(vendor, reply(fixture(vendor.name, vendor.gateway_timeout_fixture), 504))
    assert isinstance(result, vendor.gateway_timeout)


@vendors
def test_submit_connect_failure_is_a_safe_rejection(vendor: Vendor) -> None:
    result, _ = submit_with(vendor, httpx.ConnectError("connection refused"))
    assert isinstance(result, Rejected) and result.error_class is ErrorClass.CONNECT_FAILED


@vendors
@pytest.mark.parametrize("exc", [httpx.ReadTimeout("read timed out"), httpx.RemoteProtocolError("reset")])
def test_submit_without_an_answer_after_sending_is_ambiguous(vendor: Vendor, exc: Exception) -> None:
    result, _ = submit_with(vendor, exc)
    assert isinstance(result, Ambiguous)


@vendors
def test_submit_2xx_without_a_job_id_is_ambiguous(vendor: Vendor) -> None:
    result, _ = submit_with(vendor, httpx.Response(200, json={}))
    assert isinstance(result, Ambiguous)


# --- query --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("vendor", "routes", "expected"), cases(lambda v: v.statuses))
def test_query_maps_every_documented_status(vendor: Vendor, routes: R, expected: JobStatus) -> None:
    p, _ = provider(vendor, routes)
    obs = p.query(vendor.job_id)
    assert isinstance(obs, Observation) and obs.status is expected and obs.job_id == vendor.job_id
    if expected is JobStatus.FAILED:
        assert obs.error_message or obs.error_code


@vendors
def test_query_early_404_is_not_found(vendor: Vendor) -> None:
    p, router = provider(vendor, vendor.not_found_routes)
    assert isinstance(p.query(vendor.job_id), NotFound)
    assert len(router.calls) == len(vendor.not_found_routes)


@vendors
@pytest.mark.parametrize(
    "action",
    [httpx.Response(503, text="upstream"), httpx.ConnectError("down"), httpx.ReadTimeout("slow")],
    ids=["5xx", "connect", "timeout"],
)
def test_query_failures_change_nothing(vendor: Vendor, action: Any) -> None:
    routes = {route: action for route in vendor.statuses[0][0]}
    p, _ = provider(vendor, routes)
    result = p.query(vendor.job_id)
    assert isinstance(result, QueryFailed) and result.error_class is ErrorClass.QUERY_FAILED


def _set_status(vendor: Vendor, fx: dict[str, Any], value: str) -> dict[str, Any]:
    target = fx["body"]["data"] if vendor.name == "kling" else fx["body"]
    target["task_status" if vendor.name == "kling" else "status"] = value
    return fx


@vendors
def test_query_never_guesses_an_unknown_status(vendor: Vendor) -> None:
    routes, _ = vendor.statuses[0]
    ((route, name),) = routes.items()
    p, _ = provider(vendor, {route: reply(_set_status(vendor, fixture(vendor.name, name), "MYSTERY"))})
    result = p.query(vendor.job_id)
    assert isinstance(result, QueryFailed) and "MYSTERY" in (result.message or "")


def test_retry_after_as_an_http_date_is_measured_on_the_vendor_clock() -> None:
    late = httpx.Response(
        429,
        headers={"Date": "Wed, 01 Jul 2026 12:00:00 GMT", "Retry-After": "Wed, 01 Jul 2026 12:00:30 GMT"},
        json={"error": "slow down"},
    )
    result, _ = submit_with(BY_NAME["runway"], late)
    assert isinstance(result, Rejected) and result.retry_after_s == 30.0
    undated = httpx.Response(429, headers={"Retry-After": "Wed, 01 Jul 2026 12:00:30 GMT"}, json={})
    result, _ = submit_with(BY_NAME["runway"], undated)
    assert isinstance(result, Rejected) and result.retry_after_s is None


def test_runway_progress_is_a_percentage() -> None:
    p, _ = provider(BY_NAME["runway"], {RW_TASK: "task_RUNNING"})
    obs = p.query(RW_ID)
    assert isinstance(obs, Observation) and obs.progress == 42


@vendors
def test_succeeded_outputs_carry_their_expiry(vendor: Vendor) -> None:
    p, _ = provider(vendor, vendor.succeeded_routes)
    obs = p.query(vendor.job_id)
    assert isinstance(obs, Observation) and obs.billed is True
    (out,) = obs.outputs
    assert out.url == vendor.output_url and out.expires_at == vendor.output_expires_at
    assert p.capabilities.output_url_ttl_s is not None


# --- find and cancel ----------------------------------------------------------------------------------------------


@vendors
def test_find_by_request_key(vendor: Vendor) -> None:
    routes = {("GET", "/v1/videos/text2video"): "task_succeed"} if vendor.lookup else {}
    p, router = provider(vendor, routes)
    found = p.find(KEY)
    if not vendor.lookup:
        assert isinstance(found, Unsupported) and not router.calls
        return
    assert isinstance(found, Observation) and found.request_key == KEY and found.job_id == vendor.job_id
    assert parse_qs(router.calls[0].url.query.decode()) == {"external_task_id": [KEY]}


@pytest.mark.parametrize(("vendor", "routes", "expected"), cases(lambda v: v.cancels))
def test_cancel(vendor: Vendor, routes: R, expected: type) -> None:
    p, router = provider(vendor, routes)
    assert isinstance(p.cancel(vendor.job_id), expected)
    assert len(router.calls) == len(routes)


# --- callbacks ----------------------------------------------------------------------------------------------------


def callback_body(vendor: Vendor) -> bytes:
    return json.dumps(fixture(vendor.name, vendor.callback_fixture)["body"]).encode()


@vendors
def test_callback_with_a_valid_signature_is_one_observation(vendor: Vendor) -> None:
    p, _ = provider(vendor, {})
    body = callback_body(vendor)
    (obs,) = p.parse_callback(vendor.sign(body), body, NOW)
    assert obs.job_id == vendor.job_id and obs.status is JobStatus.SUCCEEDED
    assert obs.outputs and obs.outputs[0].url == vendor.output_url
    if vendor.name != "runway":  # the vendor's own deliveries are deduped by a stable id
        assert obs.event_id and p.parse_callback(vendor.sign(body), body, NOW)[0].event_id == obs.event_id


def forgeries(vendor: Vendor) -> list[tuple[str, Callable[[bytes], tuple[dict[str, str], bytes]]]]:
    out: list[tuple[str, Callable[[bytes], tuple[dict[str, str], bytes]]]] = [
        ("wrong_secret", lambda b: (vendor.wrong_secret(b), b)),
        ("no_credentials", lambda b: ({"content-type": "application/json"}, b)),
        ("not_utf8", lambda b: (vendor.sign(b), b"\xff\xfe" + b)),
        ("not_json", lambda b: (vendor.sign(b), b"[1, 2")),
    ]
    if vendor.name == "kling":  # the token binds the job, not the body: swapping the job is what it must stop
        out.append(("other_job", lambda b: (vendor.sign(b), b.replace(KEY.encode(), b"req_someone_else"))))
    elif vendor.name != "runway":  # signatures cover the body: a swapped output URL must not pass
        out.append(("tampered_body", lambda b: (vendor.sign(b), b.replace(b"abc123", b"evil99"))))
    if vendor.timestamped_signature:
        out.append(("stale", lambda b: (vendor.sign(b, NOW - timedelta(seconds=301)), b)))
        out.append(("future", lambda b: (vendor.sign(b, NOW + timedelta(seconds=301)), b)))
    return out


@pytest.mark.parametrize(("vendor", "name", "forge"), cases(forgeries))
def test_callback_forgeries_are_rejected(vendor: Vendor, name: str, forge: Callable[..., Any]) -> None:
    p, router = provider(vendor, {})
    headers, body = forge(callback_body(vendor))
    with pytest.raises(CallbackRejected):
        p.parse_callback(headers, body, NOW)
    assert not router.calls


# --- vendor specifics: billing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "billed"), [("prediction_aborted", False), ("prediction_canceled", True), ("prediction_failed", None)]
)
def test_replicate_billing_hints(name: str, billed: bool | None) -> None:
    p, _ = provider(BY_NAME["replicate"], {R_GET: name})
    obs = p.query(R_ID)
    assert isinstance(obs, Observation) and obs.billed is billed


def test_fal_5xx_failures_are_not_billed() -> None:
    vendor = BY_NAME["fal"]
    p, _ = provider(vendor, {F_STATUS: "status_COMPLETED", F_RESULT: "result_server_error"})
    obs = p.query(F_ID)
    assert isinstance(obs, Observation) and obs.billed is False and obs.error_code == "runner_disconnected"
    body = json.dumps(fixture("fal", "webhook_error_5xx")["body"]).encode()
    (event,) = p.parse_callback(sign_fal(body), body, NOW)
    assert event.status is JobStatus.FAILED and event.billed is False


def test_kling_reports_final_unit_deduction() -> None:
    p, _ = provider(BY_NAME["kling"], {K_T2V: "task_succeed"})
    obs = p.query(K_ID)
    assert isinstance(obs, Observation) and obs.cost == 1.5 and obs.billed is True
    p, _ = provider(BY_NAME["kling"], {K_T2V: "task_failed"})
    failed = p.query(K_ID)
    assert isinstance(failed, Observation) and failed.cost == 0 and failed.billed is False


def _with_rate(vendor: Vendor, model: str, key: str, secrets: list[str], rate: float | None) -> Any:
    """The vendor's adapter with `vendor_unit_seconds` set (output seconds one unit of its own figure stands for)."""
    cfg = settings(vendor.name, model, key, secrets).model_copy(update={"vendor_unit_seconds": rate})
    return lambda http: {
        "kling": lambda: KlingProvider("kling", cfg, http, clock=FixedClock()),
        "replicate": lambda: ReplicateProvider("replicate", cfg, http),
        "fal": lambda: FalProvider("fal", cfg, http),
        "runway": lambda: RunwayProvider("runway", cfg, http),
    }[vendor.name]()


@pytest.mark.parametrize("rate", [None, 5.0])
def test_billed_units_come_from_the_vendors_own_field(rate: float | None) -> None:
    """Kling `final_unit_deduction`, Replicate `metrics.predict_time`, fal `metrics.inference_time` are recorded as the
    vendor's figure; they become billed seconds only with the provider's configured rate. Runway reports none."""

    def seconds(units: float) -> float | None:
        return None if rate is None else round(units * rate, 3)

    kling = replace(BY_NAME["kling"], make=_with_rate(BY_NAME["kling"], "kling-v2-master", "a:b", [KLING_SECRET], rate))
    obs = provider(kling, {K_T2V: "task_succeed"})[0].query(K_ID)
    assert isinstance(obs, Observation) and (obs.vendor_cost, obs.billed_seconds) == (1.5, seconds(1.5))
    failed = provider(kling, {K_T2V: "task_failed"})[0].query(K_ID)
    assert isinstance(failed, Observation) and (failed.vendor_cost, failed.billed_seconds) == (0, None)  # not billed

    rep = BY_NAME["replicate"]
    rep = replace(rep, make=_with_rate(rep, "acme/video-model", "r8_key", [REPLICATE_SECRET], rate))
    obs = provider(rep, {R_GET: "prediction_succeeded"})[0].query(R_ID)
    assert isinstance(obs, Observation) and (obs.vendor_cost, obs.billed_seconds) == (95.2, seconds(95.2))
    running = provider(rep, {R_GET: "prediction_processing"})[0].query(R_ID)
    assert isinstance(running, Observation) and (running.vendor_cost, running.billed_seconds) == (None, None)

    fal = BY_NAME["fal"]
    fal = replace(
        fal, make=_with_rate(fal, "fal-ai/kling-video/v2/master/text-to-video", "fal_key", [FAL_PUBLIC], rate)
    )
    obs = provider(fal, {F_STATUS: "status_COMPLETED", F_RESULT: "result_ok"})[0].query(F_ID)
    assert isinstance(obs, Observation) and (obs.vendor_cost, obs.billed_seconds) == (95.1, seconds(95.1))

    rw = BY_NAME["runway"]
    rw = replace(rw, make=_with_rate(rw, "gen4_turbo", "rw_key", [RUNWAY_SECRET], rate))
    obs = provider(rw, {RW_TASK: "task_SUCCEEDED"})[0].query(RW_ID)
    assert isinstance(obs, Observation) and obs.billed is True
    assert (obs.vendor_cost, obs.billed_seconds, obs.billed_outputs) == (None, None, None)  # usage per account only


# --- vendor specifics: encoding -----------------------------------------------------------------------------------


def test_runway_sends_the_version_header_and_pixel_ratio() -> None:
    vendor = BY_NAME["runway"]
    p, router = provider(vendor, {("POST", "/v1/image_to_video"): "submit_accepted"})
    p.submit(request_for(vendor, reference_urls=["https://store.example/ref.png"], aspect_ratio="9:16"), KEY)
    (sent,) = router.calls
    assert sent.headers["x-runway-version"] == "2024-11-06"
    assert json.loads(sent.content)["ratio"] == "720:1280"
    bad, router = provider(vendor, {})
    assert bad.submit(request_for(vendor, aspect_ratio="5:4"), KEY).error_class is ErrorClass.LOCAL_INVALID
    assert not router.calls


def test_runway_never_deletes_a_finished_task() -> None:
    p, router = provider(BY_NAME["runway"], {RW_TASK: "task_SUCCEEDED"})
    assert isinstance(p.cancel(RW_ID), TooLate)
    assert [c.method for c in router.calls] == ["GET"]


def test_replicate_asks_for_start_and_completed_webhooks_and_supports_versions() -> None:
    vendor = BY_NAME["replicate"]
    p, router = provider(vendor, {("POST", "/v1/predictions"): "submit_accepted"})
    result = p.submit(request_for(vendor, model="acme/video-model:5c7d5dc6"), KEY)
    assert isinstance(result, Accepted) and result.observation and result.observation.status is JobStatus.QUEUED
    body = json.loads(router.calls[0].content)
    assert body["version"] == "5c7d5dc6" and body["webhook_events_filter"] == ["start", "completed"]
    assert body["webhook"] == "https://hooks.example.com/v1/callbacks/x"


def test_fal_passes_the_webhook_and_tries_each_configured_app() -> None:
    vendor = BY_NAME["fal"]
    p, router = provider(vendor, {vendor.submit_route: "submit_accepted"})
    p.submit(request_for(vendor), KEY)
    assert parse_qs(router.calls[0].url.query.decode())["fal_webhook"] == ["https://hooks.example.com/v1/callbacks/x"]
    assert router.calls[0].headers["authorization"] == "Key fal_key"
    two_apps = settings("fal", "fal-ai/veo3", "fal_key", [FAL_PUBLIC])
    two_apps.models["fal-ai/kling-video/v2/master/text-to-video"] = two_apps.models["fal-ai/veo3"]
    router = Router(
        "fal", {("GET", f"/fal-ai/veo3/requests/{F_ID}/status"): "not_found", F_STATUS: "status_IN_PROGRESS"}
    )
    fal = FalProvider("fal", two_apps, HttpClient(base_url="https://fal.test", transport=httpx.MockTransport(router)))
    obs = fal.query(F_ID)
    assert isinstance(obs, Observation) and obs.status is JobStatus.RUNNING and len(router.calls) == 2


def test_kling_signs_a_jwt_and_binds_the_callback_token_to_the_request_key() -> None:
    vendor = BY_NAME["kling"]
    p, router = provider(vendor, {vendor.submit_route: "submit_accepted"})
    p.submit(request_for(vendor), KEY)
    sent = router.calls[0]
    assert sent.headers["authorization"] == f"Bearer {jwt_hs256('ak_test', 'sk_test', int(NOW.timestamp()))}"
    header_b64, claims_b64, sig_b64 = sent.headers["authorization"].removeprefix("Bearer ").split(".")
    expected_sig = hmac.new(b"sk_test", f"{header_b64}.{claims_b64}".encode(), hashlib.sha256).digest()
    assert base64.urlsafe_b64decode(sig_b64 + "==") == expected_sig
    claims = json.loads(base64.urlsafe_b64decode(claims_b64 + "=="))
    assert claims == {"iss": "ak_test", "exp": int(NOW.timestamp()) + 1800, "nbf": int(NOW.timestamp()) - 5}
    # end to end: the token the adapter put in the callback URL is the one parse_callback accepts
    callback_url = json.loads(sent.content)["callback_url"]
    token = parse_qs(urlsplit(callback_url).query)["aivedio_token"][0]
    body = callback_body(vendor)
    (obs,) = p.parse_callback({"X-Aivedio-Callback-Token": token}, body, NOW)
    assert obs.request_key == KEY and obs.cost == 1.5


def test_kling_429_from_an_empty_account_is_not_a_rate_limit() -> None:
    result, _ = submit_with(BY_NAME["kling"], "submit_account_depleted")
    assert isinstance(result, Rejected) and result.error_class is ErrorClass.PROVIDER_REJECTED
    assert result.code == "kling_1102"


def test_kling_service_code_outranks_the_http_status() -> None:
    # Kling's own service answered "temporarily unavailable": not created, whatever the gateway status says
    result, _ = submit_with(BY_NAME["kling"], reply(fixture("kling", "submit_server_error"), 504))
    assert isinstance(result, Rejected) and result.error_class is ErrorClass.PROVIDER_5XX_NOT_ACCEPTED


def test_kling_finds_image2video_tasks_and_misses_cleanly() -> None:
    vendor = BY_NAME["kling"]
    p, router = provider(vendor, {K_T2V: "not_found", K_I2V: "task_processing"})
    obs = p.query(K_ID)
    assert isinstance(obs, Observation) and obs.status is JobStatus.RUNNING and len(router.calls) == 2
    miss = {("GET", "/v1/videos/text2video"): "not_found", ("GET", "/v1/videos/image2video"): "not_found"}
    p, router = provider(vendor, miss)
    assert isinstance(p.find(KEY), NotFound) and len(router.calls) == 2
    # a lookup answer that names another request key is not ours
    other = fixture("kling", "task_succeed")
    other["body"]["data"]["task_info"]["external_task_id"] = "someone-else"
    p, _ = provider(
        vendor, {("GET", "/v1/videos/text2video"): reply(other), ("GET", "/v1/videos/image2video"): "not_found"}
    )
    assert isinstance(p.find(KEY), NotFound)
