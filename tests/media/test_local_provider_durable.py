"""The `local` provider with its job store (what bootstrap builds): a job outlives the process that rendered it.

Real ffmpeg and a real SQLite database. A second LocalProvider on the same data dir and database stands for the
next process; a process killed hard is stood for by a row whose owner is a process that has exited.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.config import Settings, load_settings
from aivedio_engine.db import migrate
from aivedio_engine.db.engine import make_engine
from aivedio_engine.db.local_jobs import LocalJobs
from aivedio_engine.media import render
from aivedio_engine.providers.base import Accepted, Canceled, JobStatus, Observation
from aivedio_engine.providers.local import LocalProvider
from aivedio_engine.providers.local_owners import started_at
from tests.media.test_local_provider import _download, _request, wait_for


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[sa.Engine]:
    eng = make_engine(load_settings(overrides={"database": {"url": f"sqlite:///{tmp_path}/aivedio.db"}}))
    migrate.upgrade(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def make_provider(tmp_path: Path, engine: sa.Engine) -> Iterator[Callable[..., LocalProvider]]:
    made: list[LocalProvider] = []

    def make(**options: Any) -> LocalProvider:
        options = {"fps": 12, "preset": "ultrafast", "render_timeout_s": 60, **options}
        provider = LocalProvider(
            "local", Settings().providers["local"], data_dir=tmp_path, jobs=LocalJobs(engine, "local"), **options
        )
        made.append(provider)
        return provider

    yield make
    for provider in made:
        provider.close()


def _dead_owner() -> str:
    """The owner id of a process that has exited, as a process killed hard leaves it in the store."""
    proc = subprocess.Popen(["sleep", "30"])
    started = started_at(proc.pid)
    assert started not in ("", "?")
    proc.kill()
    proc.wait()
    return f"{socket.gethostname()}:{proc.pid}:{started}:0123456789abcdef"


def _renders(engine: sa.Engine, job_id: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(sa.text("SELECT renders FROM local_jobs WHERE job_id = :j"), {"j": job_id}).scalar_one()
        )


def _ffmpegs_of(job_id: str) -> int:
    """Running renders of this job on the machine, whoever started them (argv names the per-render work dir)."""
    count = 0
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and job_id.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                count += Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            continue
    return count


def test_a_job_whose_process_died_is_rendered_again_under_its_id(
    make_provider: Callable[..., LocalProvider], engine: sa.Engine, tmp_path: Path
) -> None:
    jobs = LocalJobs(engine, "local")
    job_id, dead, now = "loc_" + "a" * 32, _dead_owner(), datetime.now(UTC)
    spec = render.make_spec("360p", "16:9", 2, 3, fps=12, preset="ultrafast")
    jobs.create(
        job_id, "attempt-key-1", {"spec": dataclasses.asdict(spec), "prompt": "a heron", "image": None}, dead, now
    )
    assert jobs.started(job_id, dead, now)  # it was mid-render when its process was killed

    provider = make_provider(realtime=True)
    first = provider.query(job_id)
    assert isinstance(first, Observation) and first.status in (JobStatus.QUEUED, JobStatus.RUNNING), first
    # another live instance (a `serve` next to the CLI) sees the job rendering and leaves it alone
    other = make_provider()
    seen = wait_for(other, job_id, JobStatus.RUNNING, JobStatus.SUCCEEDED)
    assert other.process_id(job_id) is None and _ffmpegs_of(job_id) <= 1
    assert seen.status in (JobStatus.RUNNING, JobStatus.SUCCEEDED)

    done = wait_for(provider, job_id, JobStatus.SUCCEEDED, JobStatus.FAILED)
    assert done.status is JobStatus.SUCCEEDED and done.job_id == job_id, done
    assert _download(done.outputs[0].url, tmp_path / "out.mp4")[0] == 200
    # the same request key finds the same job: a resubmit after reconciling never makes a second one
    again = provider.submit(_request(), "attempt-key-1")
    assert isinstance(again, Accepted) and again.job_id == job_id
    found = other.find("attempt-key-1")
    assert isinstance(found, Observation) and found.job_id == job_id and found.status is JobStatus.SUCCEEDED
    assert _renders(engine, job_id) == 2  # the one cut short and this one


def test_a_render_stopped_by_close_is_finished_by_the_next_instance_under_the_same_id(
    make_provider: Callable[..., LocalProvider], engine: sa.Engine, tmp_path: Path
) -> None:
    first = make_provider(realtime=True)
    accepted = first.submit(_request(duration_s=10), "attempt-key-2")
    assert isinstance(accepted, Accepted)
    job_id = accepted.job_id
    wait_for(first, job_id, JobStatus.RUNNING, until=lambda o: first.process_id(job_id) is not None)
    first.close()  # the hosting command exits (Ctrl-C'd, or `generate` without --wait)
    row = LocalJobs(engine, "local").get(job_id)
    assert row is not None and row.state is JobStatus.QUEUED and row.owner is None
    assert not list((tmp_path / "local-provider" / ".aborted").glob("loc_*"))  # not ABORTED: no resubmit

    second = make_provider()
    done = wait_for(second, job_id, JobStatus.SUCCEEDED, JobStatus.FAILED)
    assert done.status is JobStatus.SUCCEEDED, done
    assert _download(done.outputs[0].url, tmp_path / "out.mp4")[0] == 200

    # a finished output is reused: a third instance serves it without rendering anything
    third = make_provider()
    served = third.query(job_id)
    assert isinstance(served, Observation) and served.status is JobStatus.SUCCEEDED
    assert third.process_id(job_id) is None and _renders(engine, job_id) == 2
    assert _download(served.outputs[0].url, tmp_path / "again.mp4")[0] == 200
    assert (tmp_path / "again.mp4").read_bytes() == (tmp_path / "out.mp4").read_bytes()


def test_a_job_canceled_through_another_instance_stops_rendering(
    make_provider: Callable[..., LocalProvider], engine: sa.Engine
) -> None:
    renderer = make_provider(realtime=True)
    accepted = renderer.submit(_request(duration_s=10), "attempt-key-3")
    assert isinstance(accepted, Accepted)
    job_id = accepted.job_id
    wait_for(renderer, job_id, JobStatus.RUNNING, until=lambda o: renderer.process_id(job_id) is not None)
    assert isinstance(make_provider().cancel(job_id), Canceled)
    # the renderer learns it at its next progress write and stops its ffmpeg
    stopped = wait_for(renderer, job_id, JobStatus.CANCELED)
    assert stopped.status is JobStatus.CANCELED and renderer.process_id(job_id) is None


def test_a_multi_output_render_stopped_by_close_is_finished_with_every_variant_by_the_next_instance(
    make_provider: Callable[..., LocalProvider], engine: sa.Engine, tmp_path: Path
) -> None:
    """A Ctrl-C'd `generate --n 3`: the next instance renders all three variants again, and every later look (the
    instance that rendered them, or one that only finds the stored job) reports all three, billed as three."""
    first = make_provider(realtime=True)
    accepted = first.submit(_request(duration_s=4, n=3), "attempt-key-n3")
    assert isinstance(accepted, Accepted)
    job_id = accepted.job_id
    wait_for(first, job_id, JobStatus.RUNNING, until=lambda o: first.process_id(job_id) is not None)
    first.close()

    second = make_provider()
    done = wait_for(second, job_id, JobStatus.SUCCEEDED, JobStatus.FAILED)
    assert done.status is JobStatus.SUCCEEDED, done
    assert [o.index for o in done.outputs] == [0, 1, 2] and done.billed_outputs == 3
    second.close()

    third = make_provider()
    served = third.query(job_id)
    assert isinstance(served, Observation) and served.status is JobStatus.SUCCEEDED
    assert [o.index for o in served.outputs] == [0, 1, 2] and served.billed_outputs == 3
    bodies = [_download(o.url, tmp_path / f"out-{o.index}.mp4") for o in served.outputs]
    assert [status for status, _ in bodies] == [200, 200, 200]
    assert len({(tmp_path / f"out-{i}.mp4").read_bytes() for i in range(3)}) == 3  # three variants, not one thrice
