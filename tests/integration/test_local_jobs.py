"""The `local` provider's job store (db/local_jobs.py) on both dialects: one job per request key whoever asks
first, one owner at a time (a takeover needs a dead or absent owner), and writes fenced by the owner."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate
from aivedio_engine.db.engine import make_engine
from aivedio_engine.db.local_jobs import LocalJobs
from aivedio_engine.providers.base import JobStatus

NOW = datetime(2026, 1, 1, tzinfo=UTC)
PARAMS = {"spec": {"width": 640, "height": 360, "duration_s": 2, "seed": 1}, "prompt": "p", "image": None}
DEAD: Callable[[str], bool] = lambda owner: True  # noqa: E731
ALIVE: Callable[[str], bool] = lambda owner: False  # noqa: E731


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else f"sqlite:///{tmp_path}/jobs.db"
    eng = make_engine(load_settings(overrides={"database": {"url": url}}))
    migrate.upgrade(eng)
    yield eng
    eng.dispose()


def test_the_same_request_key_gives_the_same_job(engine: sa.Engine) -> None:
    jobs = LocalJobs(engine, "local")
    first, created = jobs.create("loc_a", "key-1", PARAMS, "owner-1", NOW)
    again, created_again = jobs.create("loc_b", "key-1", PARAMS, "owner-2", NOW)
    assert (created, created_again) == (True, False)
    assert again.job_id == first.job_id == "loc_a" and again.owner == "owner-1"
    assert jobs.get("loc_b") is None and jobs.by_key("key-1") == first
    assert first.state is JobStatus.QUEUED and first.params == PARAMS and first.renders == 0
    # keys are per provider name: another local provider on the same database has its own jobs
    other, created_other = LocalJobs(engine, "local-2").create("loc_c", "key-1", PARAMS, "owner-3", NOW)
    assert created_other and other.job_id == "loc_c" and LocalJobs(engine, "local-2").get("loc_a") is None


def test_concurrent_creates_with_one_key_make_one_job(engine: sa.Engine) -> None:
    jobs = LocalJobs(engine, "local")
    start = threading.Barrier(8)

    def create(i: int) -> tuple[str, bool]:
        start.wait()
        job, created = jobs.create(f"loc_{i}", "same-key", PARAMS, f"owner-{i}", NOW)
        return job.job_id, created

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(create, range(8)))
    assert len({job_id for job_id, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM local_jobs")).scalar_one() == 1


def test_a_job_is_taken_over_only_from_a_dead_or_absent_owner(engine: sa.Engine) -> None:
    jobs = LocalJobs(engine, "local")
    jobs.create("loc_a", "key-1", PARAMS, "owner-1", NOW)
    assert jobs.claim("loc_a", "owner-2", ALIVE, NOW, 5) is None  # its owner still renders it
    assert jobs.claim("loc_a", "owner-1", DEAD, NOW, 5) is None  # already ours: nothing to take over
    assert jobs.claim("loc_unknown", "owner-2", DEAD, NOW, 5) is None
    taken = jobs.claim("loc_a", "owner-2", DEAD, NOW, 5)
    assert taken is not None and taken.owner == "owner-2" and taken.state is JobStatus.QUEUED
    # the old owner, had it survived after all, can no longer write the job
    assert not jobs.record("loc_a", "owner-1", NOW, state=JobStatus.SUCCEEDED)
    assert jobs.started("loc_a", "owner-2", NOW)
    assert jobs.get("loc_a").state is JobStatus.RUNNING and jobs.get("loc_a").renders == 1  # type: ignore[union-attr]
    # released (its process stopped): anyone may take it, even with its old owner alive
    assert jobs.release(["loc_a"], "owner-2", NOW) == 1
    released = jobs.get("loc_a")
    assert released is not None and released.owner is None and released.state is JobStatus.QUEUED
    assert jobs.claim("loc_a", "owner-3", ALIVE, NOW, 5) is not None


def test_a_finished_job_is_never_taken_over(engine: sa.Engine) -> None:
    jobs = LocalJobs(engine, "local")
    jobs.create("loc_a", "key-1", PARAMS, "owner-1", NOW)
    assert jobs.record(
        "loc_a", "owner-1", NOW, state=JobStatus.SUCCEEDED, output_path="/x/loc_a.mp4", size_bytes=10, owner=None
    )
    assert jobs.claim("loc_a", "owner-2", DEAD, NOW, 5) is None
    assert jobs.release(["loc_a"], "owner-1", NOW) == 0
    done = jobs.get("loc_a")
    assert done is not None and done.state is JobStatus.SUCCEEDED and done.output_path == "/x/loc_a.mp4"
    assert jobs.cancel("loc_a", NOW).state is JobStatus.SUCCEEDED  # type: ignore[union-attr]


def test_concurrent_takeovers_have_one_winner(engine: sa.Engine) -> None:
    jobs = LocalJobs(engine, "local")
    jobs.create("loc_a", "key-1", PARAMS, "dead-owner", NOW)
    start = threading.Barrier(6)

    def claim(i: int) -> bool:
        start.wait()
        return jobs.claim("loc_a", f"owner-{i}", lambda owner: owner == "dead-owner", NOW, 5) is not None

    with ThreadPoolExecutor(6) as pool:
        assert sum(pool.map(claim, range(6))) == 1


def test_renders_that_keep_dying_end_in_failure(engine: sa.Engine) -> None:
    jobs = LocalJobs(engine, "local")
    jobs.create("loc_a", "key-1", PARAMS, "owner-0", NOW)
    for i in range(2):
        assert jobs.started("loc_a", f"owner-{i}", NOW)
        assert jobs.claim("loc_a", f"owner-{i + 1}", DEAD, NOW, 3) is not None
    assert jobs.started("loc_a", "owner-2", NOW) and jobs.get("loc_a").renders == 3  # type: ignore[union-attr]
    assert jobs.claim("loc_a", "owner-3", DEAD, NOW, 3) is None  # a fourth render is not started
    failed = jobs.get("loc_a")
    assert failed is not None and failed.state is JobStatus.FAILED and failed.error_code == "render_interrupted"
    assert failed.owner is None


def test_cancel_stops_the_job_whoever_holds_it(engine: sa.Engine) -> None:
    jobs = LocalJobs(engine, "local")
    jobs.create("loc_a", "key-1", PARAMS, "owner-1", NOW)
    canceled = jobs.cancel("loc_a", NOW)
    assert canceled is not None and canceled.state is JobStatus.CANCELED and canceled.owner is None
    assert not jobs.started("loc_a", "owner-1", NOW)  # its renderer learns it at its next write
    assert jobs.cancel("loc_nope", NOW) is None


def test_finished_jobs_are_purged_after_the_retention_unfinished_ones_never(engine: sa.Engine) -> None:
    jobs = LocalJobs(engine, "local")
    jobs.create("loc_done", "key-1", PARAMS, "owner-1", NOW)
    jobs.record("loc_done", "owner-1", NOW, state=JobStatus.SUCCEEDED, owner=None)
    jobs.create("loc_open", "key-2", PARAMS, "owner-1", NOW)
    assert jobs.purge(NOW) == 0  # not older than the cut-off
    assert jobs.purge(NOW + timedelta(seconds=1)) == 1
    assert jobs.get("loc_done") is None and jobs.get("loc_open") is not None
