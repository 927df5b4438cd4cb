"""The simulator over real loopback HTTP: lifecycle, dedupe, each fault alone, ground truth, callbacks, seeds."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from aivedio_engine.httpclient import Response, SentUnknown
from aivedio_engine.providers.sim.faults import FaultSpecError, parse_faults
from aivedio_engine.providers.webhooks import verify_webhook
from tests.support.sim import (
    OLD_SECRET,
    SECRET,
    SimHandle,
    running_sim,
    running_sink,
    wait_until,
)

BODY = {"prompt": "a red fox in snow", "model": "sim-v1", "duration_s": 5, "resolution": "720p", "aspect_ratio": "16:9"}


def submit(s: SimHandle, key: str | None = "rk-1", **changes: Any) -> Response:
    headers = {"Idempotency-Key": key} if key else {}
    return s.http.request("POST", "/v1/jobs", json={**BODY, **changes}, headers=headers)


def get(s: SimHandle, job_id: str) -> Response:
    return s.http.request("GET", f"/v1/jobs/{job_id}")


# lifecycle -----------------------------------------------------------------------------------------------------
def test_submit_query_find_and_output_lifecycle(sim: SimHandle) -> None:
    r = submit(sim)
    assert r.status == 201
    job = r.json()
    assert job["status"] == "queued" and job["request_key"] == "rk-1" and job["created_at"].endswith("Z")
    assert get(sim, job["id"]).json()["status"] == "queued"

    sim.advance(0.1)  # QUEUE_SHARE of job_seconds=0.5
    first = get(sim, job["id"]).json()
    assert first["status"] == "running"
    sim.advance(0.2)
    second = get(sim, job["id"]).json()
    assert second["status"] == "running" and second["progress"] > first["progress"]

    sim.advance(0.3)
    done = get(sim, job["id"]).json()
    assert done["status"] == "succeeded" and done["progress"] == 100
    assert datetime.fromisoformat(done["output"]["expires_at"].replace("Z", "+00:00")) > sim.clock.now()

    found = sim.http.request("GET", "/v1/jobs", params={"request_key": "rk-1"})
    assert found.status == 200 and found.json()["id"] == job["id"]

    video = sim.http.request("GET", done["output"]["url"])
    assert video.status == 200 and video.headers["content-type"] == "video/mp4"
    assert video.body[4:8] == b"ftyp" and len(video.body) > 1000  # ffmpeg's testsrc, not the fallback stub

    assert sim.http.request("POST", f"/v1/jobs/{job['id']}/cancel").json() == {
        "error": "too_late",
        "status": "succeeded",
    }


def test_unknown_ids_and_keys_are_404(sim: SimHandle) -> None:
    assert get(sim, "job_nope").status == 404
    assert get(sim, "job_nope").json() == {"error": "not_found"}
    assert sim.http.request("GET", "/v1/jobs", params={"request_key": "nope"}).status == 404
    assert sim.http.request("POST", "/v1/jobs/job_nope/cancel").status == 404


def test_invalid_requests_are_rejected_without_creating_a_job(sim: SimHandle) -> None:
    assert submit(sim, duration_s=99).json() == {"error": "invalid_duration"}
    assert submit(sim, prompt="[moderate] something").json() == {"error": "content_moderated"}
    assert submit(sim, model="").status == 400
    assert sim.truth()["jobs"] == []


def test_cancel_before_start_is_not_billed_and_after_start_is(sim: SimHandle) -> None:
    queued = submit(sim, key="q").json()["id"]
    assert sim.http.request("POST", f"/v1/jobs/{queued}/cancel").json()["status"] == "canceled"
    running = submit(sim, key="r").json()["id"]
    sim.advance(0.2)
    assert sim.http.request("POST", f"/v1/jobs/{running}/cancel").status == 200
    assert sim.http.request("POST", f"/v1/jobs/{running}/cancel").status == 200  # idempotent
    sim.advance(5)
    jobs = {j["id"]: j for j in sim.truth()["jobs"]}
    assert jobs[queued] | {"created_at": None} == {
        "id": queued,
        "request_key": "q",
        "created_at": None,
        "billed": False,
        "status": "canceled",
        "canceled": True,
    }
    assert jobs[running]["billed"] is True and jobs[running]["status"] == "canceled"


def test_prompt_marker_makes_the_job_fail_unbilled(sim: SimHandle) -> None:
    job = submit(sim, prompt="[fail] please").json()["id"]
    sim.advance(1)
    body = get(sim, job).json()
    assert body["status"] == "failed" and body["error"]["code"] == "generation_failed" and "output" not in body
    assert sim.truth()["jobs"][0]["billed"] is False


# idempotency and ground truth ----------------------------------------------------------------------------------
def test_same_request_key_twice_is_one_job_billed_once(sim: SimHandle) -> None:
    first, second = submit(sim, key="same"), submit(sim, key="same")
    assert first.status == second.status == 201
    assert first.json()["id"] == second.json()["id"]
    assert second.headers.get("idempotent-replayed") == "true"
    truth = sim.truth()
    assert truth["by_request_key"] == {"same": 1} and len(truth["jobs"]) == 1
    assert truth["duplicate_paid_jobs"] == 0 and truth["calls"]["submit"] == 2


def test_no_lookup_makes_duplicates_visible_in_ground_truth(sim_factory: Any) -> None:
    s = sim_factory(lookup=False)
    assert s.http.request("GET", "/v1/jobs", params={"request_key": "k"}).status == 501
    a, b = submit(s, key="k").json()["id"], submit(s, key="k").json()["id"]
    assert a != b
    truth = s.truth()
    assert truth["by_request_key"] == {"k": 2}
    assert truth["duplicate_jobs"] == 1 and truth["duplicate_paid_jobs"] == 1
    assert all(j["billed"] for j in truth["jobs"])


def test_truth_counts_calls_and_reset_clears(sim: SimHandle) -> None:
    job = submit(sim).json()["id"]
    get(sim, job)
    get(sim, job)
    sim.http.request("GET", "/v1/jobs", params={"request_key": "rk-1"})
    sim.http.request("POST", f"/v1/jobs/{job}/cancel")
    calls = sim.truth()["calls"]
    assert (calls["submit"], calls["query"], calls["find"], calls["cancel"]) == (1, 2, 1, 1)
    sim.reset()
    truth = sim.truth()
    assert truth["jobs"] == [] and truth["calls"]["submit"] == 0 and truth["by_request_key"] == {}


def test_max_concurrency_is_respected_and_excess_jobs_wait_throttled(sim_factory: Any) -> None:
    s = sim_factory(max_concurrency=2, job_seconds=1.0)
    ids = [submit(s, key=f"k{i}").json()["id"] for i in range(5)]
    s.advance(0.1)
    statuses = [get(s, i).json()["status"] for i in ids]
    assert statuses == ["running", "running", "throttled", "throttled", "throttled"]
    for _ in range(8):
        s.advance(0.5)
    truth = s.truth()
    assert all(j["status"] == "succeeded" for j in truth["jobs"])
    assert truth["max_concurrent_running"] == 2


# faults, one at a time with probability 1 ------------------------------------------------------------------------
def test_fault_5xx_answers_500_and_creates_nothing(sim_factory: Any) -> None:
    s = sim_factory(faults="5xx=1")
    r = submit(s)
    assert r.status == 500 and s.truth()["jobs"] == []


def test_fault_429_answers_retry_after_and_creates_nothing(sim_factory: Any) -> None:
    s = sim_factory(faults="429=1,retry_after=2s")
    r = submit(s)
    assert r.status == 429 and r.headers["retry-after"] == "2"
    assert s.truth()["jobs"] == []


def test_fault_ambiguous_drops_the_response_but_the_job_exists_and_is_billed(sim_factory: Any) -> None:
    s = sim_factory(faults="ambiguous=1")
    with pytest.raises(SentUnknown):
        submit(s, key="amb")
    truth = s.truth()
    assert truth["by_request_key"] == {"amb": 1} and truth["jobs"][0]["billed"] is True
    s.set_faults("")
    assert submit(s, key="amb").json()["id"] == truth["jobs"][0]["id"]  # the retry finds it, no second job


def test_fault_reset_drops_the_connection_and_creates_nothing(sim_factory: Any) -> None:
    s = sim_factory(faults="reset=1")
    with pytest.raises(SentUnknown):
        submit(s)
    assert s.truth()["jobs"] == []


def test_fault_throttled_holds_the_job_before_running(sim_factory: Any) -> None:
    s = sim_factory(faults="throttled=1", job_seconds=1.0)
    job = submit(s).json()
    assert job["status"] == "throttled"
    s.advance(0.2)
    assert get(s, job["id"]).json()["status"] == "throttled"
    s.advance(0.2)
    assert get(s, job["id"]).json()["status"] == "running"


def test_fault_latency_delays_every_vendor_call(sim_factory: Any) -> None:
    s = sim_factory(faults="latency=80ms..120ms")
    t0 = time.monotonic()
    job = submit(s).json()["id"]
    get(s, job)
    assert time.monotonic() - t0 >= 0.16
    latencies = [v for name, v in s.state.dice.history if name == "latency"]
    assert len(latencies) == 2 and all(0.08 <= v <= 0.12 for v in latencies)


def test_fault_fail_ends_jobs_failed(sim_factory: Any) -> None:
    s = sim_factory(faults="fail=1")
    job = submit(s).json()["id"]
    s.advance(1)
    assert get(s, job).json()["status"] == "failed"


def test_fault_url_expire_gives_403_after_the_ttl_and_a_requery_refreshes(sim_factory: Any) -> None:
    s = sim_factory(faults="url_expire=1s")
    job = submit(s).json()["id"]
    s.advance(1)
    url = get(s, job).json()["output"]["url"]
    assert s.http.request("GET", url).status == 200
    s.advance(1.5)
    assert s.http.request("GET", url).status == 403
    fresh = get(s, job).json()["output"]["url"]
    assert fresh != url and s.http.request("GET", fresh).status == 200
    tampered = fresh.replace("sig=", "sig=0")
    assert s.http.request("GET", tampered).status == 403


def test_fault_redirect_sends_302_to_another_sim_path(sim_factory: Any) -> None:
    s = sim_factory(faults="redirect=1")
    job = submit(s).json()["id"]
    s.advance(1)
    r = s.http.request("GET", get(s, job).json()["output"]["url"])
    assert r.status == 302 and r.headers["location"].startswith(f"/outputs/r/{job}.mp4?")
    followed = s.http.request("GET", r.headers["location"])
    assert followed.status == 200 and followed.body[4:8] == b"ftyp"


def test_fault_cancel_too_late_finishes_the_job_first(sim_factory: Any) -> None:
    s = sim_factory(faults="cancel_too_late=1")
    job = submit(s).json()["id"]
    s.advance(0.2)
    r = s.http.request("POST", f"/v1/jobs/{job}/cancel")
    assert r.status == 409 and r.json()["error"] == "too_late"
    assert get(s, job).json()["status"] == "succeeded"
    assert s.truth()["jobs"][0]["canceled"] is False


def test_fault_invisible_makes_fresh_jobs_404_for_a_while(sim_factory: Any) -> None:
    s = sim_factory(faults="invisible=1s")
    job = submit(s).json()["id"]
    assert get(s, job).status == 404
    assert s.http.request("GET", "/v1/jobs", params={"request_key": "rk-1"}).status == 404
    s.advance(1)
    assert get(s, job).status == 200


def test_faults_can_be_changed_over_http_and_bad_specs_are_refused(sim: SimHandle) -> None:
    r = sim.http.request("POST", "/_sim/faults", json={"spec": "bogus=1"})
    assert r.status == 400 and "bogus" in r.json()["detail"]
    sim.set_faults("5xx=1")
    assert submit(sim).status == 500
    sim.set_faults("")
    assert submit(sim).status == 201
    assert sim.truth()["faults"] == ""


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ambiguous=2", "outside"),
        ("latency=2s..1s", "ends before"),
        ("nope=1", "unknown fault"),
        ("ambiguous", "NAME=VALUE"),
        ("url_expire=soon", "duration"),
        ("5xx=x", "probability"),
    ],
)
def test_fault_spec_errors_name_the_item(spec: str, message: str) -> None:
    with pytest.raises(FaultSpecError, match=message):
        parse_faults(spec)


def test_fault_spec_round_trips() -> None:
    spec = (
        "ambiguous=0.2,5xx=0.1,429=0.05,throttled=0.1,latency=50ms..200ms,dup_cb=0.3,reorder_cb=0.3,"
        "drop_cb=0.1,early_cb=0.05,url_expire=1s,redirect=0.2,cancel-too-late=0.5"
    )
    faults = parse_faults(spec)
    assert faults.p("cancel_too_late") == 0.5 and faults.latency_s == (0.05, 0.2) and faults.url_expire_s == 1
    assert parse_faults(faults.to_spec()) == faults


# reproducibility -------------------------------------------------------------------------------------------------
def _outcomes(seed: int) -> list[int | str]:
    out: list[int | str] = []
    with running_sim(seed=seed, faults="5xx=0.3,429=0.2,ambiguous=0.2,throttled=0.5") as s:
        for i in range(30):
            try:
                r = submit(s, key=f"k{i}")
                out.append(r.json()["status"] if r.status == 201 else r.status)
            except SentUnknown:
                out.append("dropped")
        out.extend(j["id"] for j in s.truth()["jobs"])
    return out


def test_same_seed_same_fault_sequence_other_seed_differs() -> None:
    a, b, c = _outcomes(11), _outcomes(11), _outcomes(12)
    assert a == b
    assert a != c
    assert {"dropped", 500, 429, "queued", "throttled"} <= set(a)


# callbacks -------------------------------------------------------------------------------------------------------
def _statuses(received: list[Any]) -> list[str]:
    import json

    return [json.loads(r.body)["status"] for r in received]


def test_callbacks_are_signed_verifiable_and_carry_the_event_id(sim_factory: Any, callback_sink: Any) -> None:
    s = sim_factory(webhook_url=callback_sink.url, webhook_secrets=(SECRET, OLD_SECRET))
    job = submit(s).json()["id"]
    s.advance(1)
    got = callback_sink.wait_for(3)
    assert _statuses(got) == ["queued", "running", "succeeded"]
    for item in got:
        assert len(item.headers["webhook-signature"].split()) == 2  # one signature per secret: rotation
        for secret in (SECRET, OLD_SECRET):
            verified = verify_webhook(item.headers, item.body, [secret], datetime.now(UTC))
            assert verified.msg_id == item.headers["webhook-id"] == verified.json()["event_id"]
            assert verified.json()["id"] == job
    assert len({r.headers["webhook-id"] for r in got}) == 3


def test_per_job_callback_url_wins_over_the_global_one(sim: SimHandle, callback_sink: Any) -> None:
    submit(sim, callback_url=callback_sink.url)
    assert _statuses(callback_sink.wait_for(1)) == ["queued"]


def test_fault_dup_cb_repeats_each_event_with_the_same_id(sim_factory: Any, callback_sink: Any) -> None:
    s = sim_factory(webhook_url=callback_sink.url, faults="dup_cb=1")
    submit(s)
    s.advance(1)
    truth = wait_until(
        lambda: (c := s.truth()["callbacks"])["emitted"] == 3 and c["pending"] == 0 and c,
        what="all deliveries to finish",
    )
    got = callback_sink.wait_for(truth["delivered"])
    per_id = Counter(r.headers["webhook-id"] for r in got)
    assert len(per_id) == 3 and all(2 <= n <= 4 for n in per_id.values())
    assert truth["duplicates"] == sum(n - 1 for n in per_id.values())


def test_fault_drop_cb_delivers_nothing(sim_factory: Any, callback_sink: Any) -> None:
    s = sim_factory(webhook_url=callback_sink.url, faults="drop_cb=1")
    submit(s)
    s.advance(1)
    wait_until(lambda: s.truth()["callbacks"]["dropped"] == 3, what="three dropped events")
    assert callback_sink.received == [] and s.truth()["callbacks"]["delivered"] == 0


def test_fault_reorder_cb_delivers_out_of_order(sim_factory: Any, callback_sink: Any) -> None:
    s = sim_factory(webhook_url=callback_sink.url, faults="reorder_cb=1")
    submit(s)
    s.advance(1)
    got = callback_sink.wait_for(3)
    assert sorted(_statuses(got)) == ["queued", "running", "succeeded"]
    assert _statuses(got) != ["queued", "running", "succeeded"]


def test_fault_early_cb_arrives_before_the_submit_response(sim_factory: Any, callback_sink: Any) -> None:
    s = sim_factory(webhook_url=callback_sink.url, faults="early_cb=1")
    job = submit(s).json()["id"]
    assert len(callback_sink.received) == 1  # no waiting: it was delivered before the response was sent
    assert callback_sink.received[0].body.count(job.encode()) >= 1


def test_callback_delivery_retries_non_2xx_then_gives_up(sim_factory: Any) -> None:
    with running_sink(status=503) as sink:
        s = sim_factory(webhook_url=sink.url)
        submit(s)
        got = sink.wait_for(3)
        assert len({r.headers["webhook-id"] for r in got}) == 1  # the same event, retried
        wait_until(lambda: s.truth()["callbacks"]["failed"] == 1, what="delivery to give up")


def test_real_clock_mode_moves_jobs_by_itself() -> None:
    with running_sim(job_seconds=0.2, real_clock=True) as s:
        job = submit(s).json()["id"]
        wait_until(lambda: get(s, job).json()["status"] == "succeeded", timeout_s=10, what="job to succeed")
        with pytest.raises(RuntimeError):
            s.advance(1)


def test_http_advance_endpoint(sim: SimHandle) -> None:
    before = sim.clock.now()
    r = sim.http.request("POST", "/_sim/advance", json={"seconds": 2})
    assert r.status == 200 and (sim.clock.now() - before).total_seconds() == 2


def test_client_without_idempotency_key_gets_a_new_job_each_time(sim: SimHandle) -> None:
    a, b = submit(sim, key=None).json()["id"], submit(sim, key=None).json()["id"]
    assert a != b and sim.truth()["by_request_key"] == {}


# billing -------------------------------------------------------------------------------------------------------


def test_a_finished_job_reports_its_bill_and_can_be_voided_once() -> None:
    with running_sim(seed=7, job_seconds=1) as s:
        s.configure(bill_factor=0.6, cost_per_second=0.1)
        job_id = submit(s).json()["id"]
        assert "billed_seconds" not in get(s, job_id).json()  # nothing billed while it runs
        assert s.http.request("POST", f"/_sim/jobs/{job_id}/void").status == 409
        s.advance(2)
        done = get(s, job_id).json()
        assert done["status"] == "succeeded" and (done["billed_seconds"], done["cost"]) == (3.0, 0.3)
        assert "refunded" not in done
        s.advance(1)
        voided = s.http.request("POST", f"/_sim/jobs/{job_id}/void").json()
        assert voided["refunded"] is True and voided["status"] == "succeeded"
        assert voided["updated_at"] > done["updated_at"]  # a new fact: a new observation, not a duplicate
        again = s.http.request("POST", f"/_sim/jobs/{job_id}/void").json()
        assert again["updated_at"] == voided["updated_at"]  # voiding twice changes nothing
        assert s.http.request("POST", "/_sim/jobs/nope/void").status == 404


def test_the_sims_moderation_charges_then_refunds_a_failed_job() -> None:
    with running_sim(seed=8, job_seconds=1) as s:
        job_id = submit(s, prompt="a fox [moderation]").json()["id"]
        s.advance(2)
        job = get(s, job_id).json()
        assert (job["status"], job["error"]["code"], job["billed"], job["refunded"]) == (
            "failed",
            "moderation",
            True,
            True,
        )
        assert job["billed_seconds"] == 5.0
