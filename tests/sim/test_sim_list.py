"""The sim's job listing (`GET /v1/jobs?created_after=&created_before=`) and the adapter's `list_jobs` over it."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from aivedio_engine.db.attempts import fingerprint as attempt_fingerprint
from aivedio_engine.providers.base import (
    Accepted,
    GenerationRequest,
    JobStatus,
    JobSummary,
    QueryFailed,
    Unsupported,
)
from aivedio_engine.providers.sim.server import _iso
from tests.support.sim import SimHandle

REQUEST = GenerationRequest(
    prompt="a lighthouse at dusk",
    model="sim-v1",
    duration_s=5,
    resolution="720p",
    aspect_ratio="16:9",
    seed=42,
    reference_urls=("https://cdn.example/ref.png",),
    callback_url="https://hooks.example/cb",
)
BODY = {"prompt": "a red fox in snow", "model": "sim-v1", "duration_s": 5, "resolution": "720p", "aspect_ratio": "16:9"}


def listing(s: SimHandle, after: datetime | None = None, before: datetime | None = None, **extra: Any) -> Any:
    params = {
        "created_after": _iso(after or s.clock.now() - timedelta(hours=1)),
        "created_before": _iso(before or s.clock.now() + timedelta(hours=1)),
        **extra,
    }
    return s.http.request("GET", "/v1/jobs", params=params)


def window(s: SimHandle) -> tuple[datetime, datetime]:
    now = s.clock.now()
    return now - timedelta(minutes=5), now + timedelta(minutes=5)


def test_listing_is_off_by_default_so_lookup_off_means_neither(sim_factory: Any) -> None:
    s = sim_factory(lookup=False)
    r = listing(s)
    assert r.status == 501 and r.json() == {"error": "unsupported"}
    assert s.provider().list_jobs(*window(s)) == Unsupported()
    assert s.truth()["calls"]["list"] == 0 and s.truth()["listing"] is False


def test_listing_works_without_lookup_and_echoes_the_request_but_not_the_key(sim_factory: Any) -> None:
    s = sim_factory(lookup=False, job_seconds=2.0)
    s.configure(listing=True)
    accepted = s.provider().submit(REQUEST, "avd-secret-key")
    assert isinstance(accepted, Accepted)
    assert s.http.request("GET", "/v1/jobs", params={"request_key": "avd-secret-key"}).status == 501
    r = listing(s)
    assert r.status == 200
    body = r.json()
    assert body["next"] is None and len(body["jobs"]) == 1
    item = body["jobs"][0]
    assert item["id"] == accepted.job_id and item["status"] == "queued"
    assert item["created_at"] == _iso(s.clock.now())
    assert item["request"] == {
        "prompt": REQUEST.prompt,
        "model": "sim-v1",
        "duration_s": 5,
        "resolution": "720p",
        "aspect_ratio": "16:9",
        "seed": 42,
        "reference_urls": list(REQUEST.reference_urls),
    }
    assert "request_key" not in item and "avd-secret-key" not in r.body.decode()
    s.advance(1.0)
    assert listing(s).json()["jobs"][0]["status"] == "running"
    assert s.truth()["calls"]["list"] == 2


def test_adapter_summaries_carry_the_fingerprint_the_attempt_stores(sim_factory: Any) -> None:
    s = sim_factory(lookup=False)
    s.configure(listing=True)
    provider = s.provider()
    ours = provider.submit(REQUEST, "k1")
    other = provider.submit(GenerationRequest(**{**BODY, "prompt": "something else"}), "k2")
    assert isinstance(ours, Accepted) and isinstance(other, Accepted)
    jobs = provider.list_jobs(*window(s))
    assert isinstance(jobs, list) and all(isinstance(j, JobSummary) for j in jobs)
    by_id = {j.job_id: j for j in jobs}
    assert set(by_id) == {ours.job_id, other.job_id}
    # what the task row holds (our own fields included) hashes to what the vendor echoes of the request
    params = {
        "prompt": REQUEST.prompt,
        "model": "sim-v1",
        "provider": "sim",
        "duration_s": 5,
        "aspect_ratio": "16:9",
        "resolution": "720p",
        "priority": 0,
        "deadline_s": 3600,
        "seed": 42,
        "asset_ids": [],
    }
    assert by_id[ours.job_id].fingerprint == attempt_fingerprint(params)
    assert by_id[other.job_id].fingerprint not in (None, attempt_fingerprint(params))
    assert by_id[ours.job_id].status is JobStatus.QUEUED
    assert by_id[ours.job_id].created_at == s.clock.now()


def test_window_is_created_after_inclusive_created_before_exclusive(sim_factory: Any) -> None:
    s = sim_factory()
    s.configure(listing=True)
    t0 = s.clock.now()
    ids = []
    for i in range(3):
        ids.append(s.state.submit({**BODY, "prompt": f"p{i}"}, f"k{i}").body["id"])
        s.advance(10)
    got = [j["id"] for j in listing(s, t0 + timedelta(seconds=10), t0 + timedelta(seconds=20)).json()["jobs"]]
    assert got == [ids[1]]
    summaries = s.provider().list_jobs(t0, t0 + timedelta(seconds=20))
    assert isinstance(summaries, list) and [j.job_id for j in summaries] == [ids[1], ids[0]]  # newest first


def test_pages_follow_the_cursor_and_the_adapter_reads_them_all(sim_factory: Any) -> None:
    s = sim_factory()
    s.configure(listing=True)
    ids = [s.state.submit({**BODY, "prompt": f"p{i}"}, f"k{i}").body["id"] for i in range(105)]
    first = listing(s, limit=2).json()
    assert [j["id"] for j in first["jobs"]] == ids[:-3:-1] and first["next"]
    second = listing(s, limit=2, cursor=first["next"]).json()
    assert [j["id"] for j in second["jobs"]] == [ids[-3], ids[-4]]
    calls = s.truth()["calls"]["list"]
    summaries = s.provider().list_jobs(*window(s))
    assert isinstance(summaries, list) and sorted(j.job_id for j in summaries) == sorted(ids)
    assert s.truth()["calls"]["list"] - calls == 2  # 100 a page


def test_fresh_jobs_are_invisible_in_the_listing_too(sim_factory: Any) -> None:
    s = sim_factory(faults="invisible=30s")
    s.configure(listing=True)
    job = s.state.submit(BODY, "k").body["id"]
    assert listing(s).json()["jobs"] == []
    s.advance(30)
    assert [j["id"] for j in listing(s).json()["jobs"]] == [job]


def test_bad_filters_are_400_and_the_adapter_reports_query_failed(sim_factory: Any) -> None:
    s = sim_factory()
    s.configure(listing=True)
    assert s.http.request("GET", "/v1/jobs", params={"created_after": "yesterday"}).status == 400
    assert s.http.request("GET", "/v1/jobs", params={"cursor": "x"}).status == 400
    dead = s.provider(base_url="http://127.0.0.1:9")
    assert isinstance(dead.list_jobs(*window(s)), QueryFailed)


def test_config_endpoint_switches_listing(sim: SimHandle) -> None:
    r = sim.http.request("POST", "/_sim/config", json={"listing": True})
    assert r.status == 200 and r.json()["listing"] is True
    assert listing(sim).status == 200
