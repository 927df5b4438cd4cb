"""The `sim` adapter against a real sim server: every HTTP outcome mapped to the Protocol's values."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.httpclient import HttpClient, Timeouts
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
from aivedio_engine.providers.sim.adapter import SimProvider
from aivedio_engine.providers.webhooks import new_secret, sign_webhook
from tests.support.sim import (
    OLD_SECRET,
    SECRET,
    SimHandle,
    wait_until,
)

REQUEST = GenerationRequest(
    prompt="a lighthouse at dusk",
    model="sim-v1",
    duration_s=5,
    resolution="720p",
    aspect_ratio="16:9",
    seed=42,
    reference_urls=("https://cdn.example/ref.png",),
)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# submit ----------------------------------------------------------------------------------------------------------
def test_provider_satisfies_the_protocol_and_reports_capabilities(sim: SimHandle) -> None:
    provider = sim.provider(supports_lookup_by_request_key=False, output_url_ttl_s=120)
    assert isinstance(provider, Provider)
    caps = provider.capabilities
    assert caps.models == ("sim-v1",) and caps.max_duration_s == 10 and caps.resolutions == ("1080p", "720p")
    assert caps.supports_callbacks and caps.supports_cancel and not caps.supports_lookup_by_request_key
    assert caps.output_url_ttl_s == 120
    assert sim.provider(webhook_secrets=[]).capabilities.supports_callbacks is False


def test_submit_accepted_sends_the_request_key_and_the_body(sim: SimHandle) -> None:
    result = sim.provider().submit(REQUEST, "rk-accept")
    assert isinstance(result, Accepted)
    assert result.observation is not None and result.observation.status is JobStatus.QUEUED
    assert result.observation.request_key == "rk-accept"
    job = sim.state.jobs[result.job_id]
    assert job.request["seed"] == 42 and job.request["reference_urls"] == ["https://cdn.example/ref.png"]
    assert sim.truth()["by_request_key"] == {"rk-accept": 1}


def test_submit_same_key_twice_is_the_same_job(sim: SimHandle) -> None:
    provider = sim.provider()
    a, b = provider.submit(REQUEST, "rk"), provider.submit(REQUEST, "rk")
    assert isinstance(a, Accepted) and isinstance(b, Accepted) and a.job_id == b.job_id
    assert sim.truth()["duplicate_paid_jobs"] == 0


def test_submit_4xx_is_rejected(sim: SimHandle) -> None:
    bad = GenerationRequest(prompt="x", model="sim-v1", duration_s=99, resolution="720p", aspect_ratio="16:9")
    assert sim.provider().submit(bad, "rk") == Rejected(ErrorClass.PROVIDER_REJECTED, "invalid_duration", "HTTP 400")
    moderated = GenerationRequest(
        prompt="[moderate]", model="sim-v1", duration_s=5, resolution="720p", aspect_ratio="16:9"
    )
    result = sim.provider().submit(moderated, "rk2")
    assert isinstance(result, Rejected) and result.code == "content_moderated"
    assert sim.truth()["jobs"] == []


def test_submit_429_is_rate_limited_with_retry_after(sim_factory: Any) -> None:
    s = sim_factory(faults="429=1,retry_after=2.5s")
    result = s.provider().submit(REQUEST, "rk")
    assert result == Rejected(ErrorClass.PROVIDER_RATE_LIMITED, "rate_limited", "rate limited", 2.5)


def test_submit_5xx_is_not_accepted_and_no_job_exists(sim_factory: Any) -> None:
    s = sim_factory(faults="5xx=1")
    result = s.provider().submit(REQUEST, "rk")
    assert isinstance(result, Rejected) and result.error_class is ErrorClass.PROVIDER_5XX_NOT_ACCEPTED
    assert s.truth()["jobs"] == []


def test_submit_connection_refused_is_connect_failed(sim: SimHandle) -> None:
    provider = sim.provider(base_url=f"http://127.0.0.1:{closed_port()}")
    result = provider.submit(REQUEST, "rk")
    assert isinstance(result, Rejected) and result.error_class is ErrorClass.CONNECT_FAILED


def test_ambiguous_accept_is_ambiguous_while_the_job_exists_and_find_reconciles(sim_factory: Any) -> None:
    s = sim_factory(faults="ambiguous=1")
    provider = s.provider()
    result = provider.submit(REQUEST, "rk-amb")
    assert isinstance(result, Ambiguous)
    truth = s.truth()
    assert truth["by_request_key"] == {"rk-amb": 1} and truth["jobs"][0]["billed"] is True
    found = provider.find("rk-amb")
    assert isinstance(found, Observation) and found.job_id == truth["jobs"][0]["id"]
    assert found.request_key == "rk-amb"


def test_connection_reset_is_also_ambiguous_and_find_says_not_found(sim_factory: Any) -> None:
    s = sim_factory(faults="reset=1")
    provider = s.provider()
    assert isinstance(provider.submit(REQUEST, "rk-reset"), Ambiguous)
    assert provider.find("rk-reset") == NotFound()
    assert s.truth()["jobs"] == []


def test_read_timeout_is_ambiguous(sim_factory: Any) -> None:
    s = sim_factory(faults="latency=300ms")
    http = HttpClient(s.base_url, Timeouts(connect=1, read=0.05, write=1, pool=1))
    provider = SimProvider("sim", s.provider_settings(), http)
    try:
        assert isinstance(provider.submit(REQUEST, "rk-slow"), Ambiguous)
        # the server still handles the request after the client gave up: the job exists (and the next
        # test must not see it arrive late)
        wait_until(lambda: s.truth()["by_request_key"] == {"rk-slow": 1}, what="the slow submit to land")
    finally:
        provider.close()


# query / find / cancel ----------------------------------------------------------------------------------------------
def test_query_follows_the_job_to_success_with_an_output(sim: SimHandle) -> None:
    provider = sim.provider()
    accepted = provider.submit(REQUEST, "rk")
    assert isinstance(accepted, Accepted)
    sim.advance(0.2)
    running = provider.query(accepted.job_id)
    assert isinstance(running, Observation) and running.status is JobStatus.RUNNING
    assert running.progress is not None and 0 < running.progress < 100 and running.event_id is None
    sim.advance(0.5)
    done = provider.query(accepted.job_id)
    assert isinstance(done, Observation) and done.status is JobStatus.SUCCEEDED and done.billed is True
    (output,) = done.outputs
    assert output.url.startswith(f"{sim.base_url}/outputs/") and output.content_type == "video/mp4"
    assert output.expires_at is not None and output.expires_at - sim.clock.now() == timedelta(seconds=3600)
    assert done.provider_updated_at is not None and done.provider_updated_at.tzinfo is not None


def test_failed_job_carries_the_error(sim: SimHandle) -> None:
    provider = sim.provider()
    failing = GenerationRequest(prompt="[fail]", model="sim-v1", duration_s=5, resolution="720p", aspect_ratio="1:1")
    accepted = provider.submit(failing, "rk")
    assert isinstance(accepted, Accepted)
    sim.advance(1)
    obs = provider.query(accepted.job_id)
    assert isinstance(obs, Observation) and obs.status is JobStatus.FAILED
    assert (obs.error_code, obs.billed, obs.outputs) == ("generation_failed", False, ())


def test_early_404_on_a_fresh_id_is_not_found_then_visible(sim_factory: Any) -> None:
    s = sim_factory(faults="invisible=1s")
    provider = s.provider()
    accepted = provider.submit(REQUEST, "rk")
    assert isinstance(accepted, Accepted)
    assert provider.query(accepted.job_id) == NotFound()
    s.advance(1)
    assert isinstance(provider.query(accepted.job_id), Observation)


def test_query_unknown_and_odd_ids(sim: SimHandle) -> None:
    provider = sim.provider()
    assert provider.query("job_missing") == NotFound()
    # an id is a path segment: it cannot reach another endpoint
    assert provider.query("../_sim/truth") == NotFound()  # percent-encoded: no route matches it
    assert provider.query("job_missing?x=1") == NotFound()


def test_query_and_cancel_against_a_dead_server_are_query_failed(sim: SimHandle) -> None:
    provider = sim.provider(base_url=f"http://127.0.0.1:{closed_port()}")
    for result in (provider.query("job_x"), provider.find("rk"), provider.cancel("job_x")):
        assert isinstance(result, QueryFailed) and result.error_class is ErrorClass.QUERY_FAILED


def test_find_not_found_and_unsupported(sim_factory: Any) -> None:
    s = sim_factory(lookup=False)
    assert s.provider().find("rk") == Unsupported()  # the server answers 501
    assert s.truth()["calls"]["find"] == 0  # 501 is answered before the state is consulted
    s.configure(lookup=True)
    assert s.provider().find("rk") == NotFound()
    assert s.truth()["calls"]["find"] == 1
    assert s.provider(supports_lookup_by_request_key=False).find("rk") == Unsupported()
    assert s.truth()["calls"]["find"] == 1  # decided from settings, no call made


def test_cancel_outcomes(sim_factory: Any) -> None:
    s = sim_factory()
    provider = s.provider()
    first = provider.submit(REQUEST, "rk-1")
    assert isinstance(first, Accepted)
    assert provider.cancel(first.job_id) == Canceled()
    assert provider.cancel(first.job_id) == Canceled()  # idempotent
    second = provider.submit(REQUEST, "rk-2")
    assert isinstance(second, Accepted)
    s.advance(1)
    assert provider.cancel(second.job_id) == TooLate()
    missing = provider.cancel("job_missing")
    assert isinstance(missing, QueryFailed) and "not_found" in (missing.message or "")


def test_cancel_too_late_fault(sim_factory: Any) -> None:
    s = sim_factory(faults="cancel_too_late=1")
    provider = s.provider()
    accepted = provider.submit(REQUEST, "rk")
    assert isinstance(accepted, Accepted)
    assert provider.cancel(accepted.job_id) == TooLate()
    obs = provider.query(accepted.job_id)
    assert isinstance(obs, Observation) and obs.status is JobStatus.SUCCEEDED


# callbacks ---------------------------------------------------------------------------------------------------------
def _callbacks(s: SimHandle, sink: Any, count: int) -> list[Any]:
    accepted = s.provider().submit(REQUEST, "rk-cb")
    assert isinstance(accepted, Accepted)
    s.advance(1)
    return sink.wait_for(count)


def test_parse_callback_from_a_real_delivery(sim_factory: Any, callback_sink: Any) -> None:
    s = sim_factory(webhook_url=callback_sink.url)
    got = _callbacks(s, callback_sink, 3)
    provider = s.provider()
    observations = [provider.parse_callback(r.headers, r.body, datetime.now(UTC)) for r in got]
    assert [o.status for (o,) in observations] == [JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED]
    for (obs,), r in zip(observations, got, strict=True):
        assert obs.event_id == r.headers["webhook-id"] and obs.request_key == "rk-cb"
    assert observations[-1][0].outputs[0].url.startswith(s.base_url)


@pytest.mark.parametrize(
    ("sender", "receiver", "accepted"),
    [
        ((SECRET,), (OLD_SECRET, SECRET), True),  # receiver mid-rotation, sender already on the new key
        ((OLD_SECRET,), (OLD_SECRET, SECRET), True),  # sender still on the old key
        ((SECRET, OLD_SECRET), (SECRET,), True),  # sender sends both, receiver already dropped the old one
        ((OLD_SECRET,), (SECRET,), False),  # overlap over: the old key alone is refused
    ],
)
def test_callback_verification_across_key_rotation(
    sim_factory: Any, callback_sink: Any, sender: tuple[str, ...], receiver: tuple[str, ...], accepted: bool
) -> None:
    s = sim_factory(webhook_url=callback_sink.url, webhook_secrets=sender)
    (first, *_) = _callbacks(s, callback_sink, 1)
    provider = s.provider(webhook_secrets=list(receiver))
    if accepted:
        (obs,) = provider.parse_callback(first.headers, first.body, datetime.now(UTC))
        assert obs.status is JobStatus.QUEUED
    else:
        with pytest.raises(CallbackRejected):
            provider.parse_callback(first.headers, first.body, datetime.now(UTC))


def test_parse_callback_rejects_tampering_staleness_and_non_jobs(sim: SimHandle) -> None:
    provider = sim.provider()
    now = datetime.now(UTC)
    body = json.dumps({"id": "job_1", "status": "succeeded", "updated_at": "2026-01-01T00:00:00Z"}).encode()
    headers = sign_webhook([SECRET], "evt_1", now, body)
    (obs,) = provider.parse_callback(headers, body, now)
    assert obs.job_id == "job_1" and obs.event_id == "evt_1"
    with pytest.raises(CallbackRejected):
        provider.parse_callback(headers, body.replace(b"succeeded", b"failed\x20\x20\x20"), now)
    with pytest.raises(CallbackRejected):
        provider.parse_callback(headers, body, now + timedelta(seconds=301))
    with pytest.raises(CallbackRejected):
        provider.parse_callback(sign_webhook([new_secret(b"x" * 32)], "evt_1", now, body), body, now)
    for signed_but_wrong in (
        b'["a list"]',
        b'{"id": "job_1", "status": "exploded"}',
        b'{"status": "queued"}',
        b"not json",
    ):
        with pytest.raises(CallbackRejected):
            provider.parse_callback(sign_webhook([SECRET], "evt_2", now, signed_but_wrong), signed_but_wrong, now)
