"""Fewer hops (issue 12): a small fetched output goes straight on to the media step in the same actor run.

Still two recorded steps (the fetch commit, then the media step's own inbox row, transaction and state change),
but no `media.process.requested` message. A large output, or a worker that does not consume the media queue,
still hops. A crash between the two steps leaves the task POST_PROCESSING with nothing pending, which the fetch
message's redelivery resumes at once (the sweeper only when that message is lost too); a media run that raises
queues its request instead. Real sim clip, real ffprobe/ffmpeg.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.db.tables import inbox_dedup, task_attempts
from aivedio_engine.providers.sim.app import sample_mp4
from aivedio_engine.testing import failpoints
from aivedio_engine.testing.failpoints import FailpointError
from aivedio_engine.worker.runtime import Runtime
from tests.flow.test_output_fetch import (
    FETCH,
    MEDIA,
    Staged,
    assert_settled,
    assets_of,
    envelope,
    history,
    mark_published,
    outbox_of,
    pending,
    stage,
    task_row,
    use_fetcher,
)
from tests.support.pump import Pump
from tests.support.sim import SimHandle

INLINE = {"inline_after_fetch_max_bytes": 16 * 1024 * 1024}
STUCK_S = 120


@pytest.fixture(autouse=True)
def _disarm() -> Any:
    failpoints.reset()
    yield
    failpoints.reset()


def staged(tmp_path: Path, sim: SimHandle, media: dict[str, Any] = INLINE, **overrides: Any) -> Staged:
    """A task in OUTPUT_FETCHING whose fetch.requested row is held back, with the inline setting given."""
    s = stage(tmp_path, sim, media=media, **overrides)
    assert s.status == "OUTPUT_FETCHING"
    return s


def inbox(s: Staged, group: str) -> list[Any]:
    with s.ctx.engine.connect() as conn:
        return list(conn.execute(sa.select(inbox_dedup).where(inbox_dedup.c.consumer_group == group)).all())


def assert_two_steps_one_attempt(s: Staged) -> None:
    steps = history(s.ctx, s.task_id)
    assert steps[-2:] == [("OUTPUT_FETCHING", "POST_PROCESSING"), ("POST_PROCESSING", "SUCCEEDED")], steps
    assert steps.count(("OUTPUT_FETCHING", "POST_PROCESSING")) == 1
    with s.ctx.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(task_attempts)).scalar_one() == 1
    assert len(s.sim.truth()["jobs"]) == 1  # one vendor job
    assert_settled(s.ctx, s.task_id)  # one RESERVE, one SETTLE


def test_small_output_runs_the_media_step_in_the_fetch_run_without_a_media_message(
    tmp_path: Path, sim: SimHandle
) -> None:
    s = staged(tmp_path, sim)
    assert len(sample_mp4()) <= INLINE["inline_after_fetch_max_bytes"]
    pump = Pump(s.ctx)

    pump.run()  # the held fetch.requested row, then everything it leads to

    assert pump.seen[FETCH] == 1 and pump.seen[MEDIA] == 0  # one actor run did both steps
    assert outbox_of(s.ctx, MEDIA, s.task_id) == []  # no media message was ever written
    assert s.status == "SUCCEEDED"
    assert_two_steps_one_attempt(s)
    (raw,) = assets_of(s.ctx, s.task_id, "RAW_OUTPUT")
    assert raw.status == "READY"
    assert {a.kind for a in assets_of(s.ctx, s.task_id) if a.parent_asset_id == raw.id} >= {
        "PROXY",
        "HLS",
        "THUMBNAIL",
    }
    # the media step was recorded as a step of its own: its own inbox row, caused by the fetch message
    (fetched,) = inbox(s, "output-fetch")
    (media,) = inbox(s, "media")
    assert media.event_id != fetched.event_id
    s.ctx.close()


def test_the_fetch_result_names_both_steps(tmp_path: Path, sim: SimHandle) -> None:
    s = staged(tmp_path, sim)

    assert s.fetch() == "stored 1; media: succeeded"
    assert s.status == "SUCCEEDED"
    s.ctx.close()


def test_an_output_over_the_limit_still_hops_through_the_media_queue(tmp_path: Path, sim: SimHandle) -> None:
    s = staged(tmp_path, sim, media={"inline_after_fetch_max_bytes": len(sample_mp4()) - 1})

    assert s.fetch() == "stored 1"

    assert s.status == "POST_PROCESSING"
    assert len(pending(s.ctx, MEDIA)) == 1
    assert s.media() == "succeeded"
    assert_two_steps_one_attempt(s)
    s.ctx.close()


def test_a_worker_without_the_media_queue_leaves_media_to_the_media_workers(tmp_path: Path, sim: SimHandle) -> None:
    s = staged(tmp_path, sim)
    Runtime(s.ctx, {"worker"}, threading.Event(), queues={"fetch", "fetch_urgent"})  # not started: only wired

    assert s.fetch() == "stored 1"

    assert s.status == "POST_PROCESSING"
    assert len(pending(s.ctx, MEDIA)) == 1
    s.ctx.close()


def test_a_crash_that_loses_the_fetch_message_too_is_redriven_by_the_sweeper(tmp_path: Path, sim: SimHandle) -> None:
    s = staged(tmp_path, sim, sweeper={"media_stuck_s": STUCK_S})
    (row,) = pending(s.ctx, FETCH)
    failpoints.configure("output_fetch.before_inline_media=raise@1")

    with pytest.raises(FailpointError):  # the process "dies" after the fetch committed, before the media step
        s.fetch()

    assert s.status == "POST_PROCESSING"
    assert pending(s.ctx, MEDIA, due_only=False) == []  # nothing queued: only the task's state tells
    assert inbox(s, "media") == []
    mark_published(s.ctx, row.id)  # and the fetch message is gone with its (in-memory) broker: no redelivery
    assert Pump(s.ctx).run() >= 0 and s.status == "POST_PROCESSING"
    s.ctx.clock.advance(STUCK_S - 10)  # type: ignore[attr-defined]
    assert s.ctx.sweeper.sweep().redriven == 0
    s.ctx.clock.advance(20)  # type: ignore[attr-defined]
    assert s.ctx.sweeper.sweep().redriven == 1
    (redriven,) = pending(s.ctx, MEDIA)
    assert redriven.payload["redriven"] is True

    Pump(s.ctx).run()

    assert s.status == "SUCCEEDED"
    assert_two_steps_one_attempt(s)
    assert len(inbox(s, "output-fetch")) == 1
    s.ctx.close()


def test_an_inline_media_run_that_raises_queues_its_request(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = staged(tmp_path, sim)
    real = type(s.ctx.media).handle
    calls: list[int] = []

    def flaky(self: Any, envelope: Any) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("database went away mid-step")
        return str(real(self, envelope))

    monkeypatch.setattr(type(s.ctx.media), "handle", flaky)

    assert s.fetch() == "stored 1; media: queued after an inline failure"

    assert s.status == "POST_PROCESSING" and inbox(s, "media") == []
    assert s.media() == "succeeded"
    assert s.status == "SUCCEEDED"
    assert_two_steps_one_attempt(s)
    assert task_row(s.ctx, s.task_id).last_error_class is None
    s.ctx.close()


#: long enough that only the fetch's redelivery, never the sweeper, can have run the media step
NEVER_S = 30 * 86_400


def test_a_redelivered_fetch_runs_the_media_step_its_first_run_never_reached(
    tmp_path: Path, sim: SimHandle, pg_url: str
) -> None:
    s = staged(tmp_path, sim, database_url=pg_url, sweeper={"media_stuck_s": NEVER_S})
    failpoints.configure("output_fetch.before_inline_media=raise@1")

    with pytest.raises(FailpointError):  # the database is lost right after the fetch committed
        s.fetch()
    assert s.status == "POST_PROCESSING" and inbox(s, "media") == []

    # the broker redelivers the fetch message: its step is done, the media step it went on to is not
    assert s.fetch() == "media: succeeded"

    assert s.status == "SUCCEEDED"
    assert_two_steps_one_attempt(s)
    assert outbox_of(s.ctx, MEDIA, s.task_id) == []  # run at once, no hop, no sweeper
    assert len(inbox(s, "output-fetch")) == 1 and len(inbox(s, "media")) == 1
    s.ctx.close()


def test_a_redelivered_fetch_on_a_fetch_only_worker_queues_the_media_step(
    tmp_path: Path, sim: SimHandle, pg_url: str
) -> None:
    s = staged(tmp_path, sim, database_url=pg_url, sweeper={"media_stuck_s": NEVER_S})
    failpoints.configure("output_fetch.before_inline_media=raise@1")
    with pytest.raises(FailpointError):
        s.fetch()
    (row,) = pending(s.ctx, FETCH)
    use_fetcher(s.ctx)  # the redelivery lands on a worker that does not run the media step itself

    assert s.ctx.output_fetch.handle(envelope(row)) == "media: queued 1"

    (queued,) = pending(s.ctx, MEDIA)
    assert queued.payload["asset_id"] == str(assets_of(s.ctx, s.task_id, "RAW_OUTPUT")[0].id)
    assert s.media() == "succeeded"
    assert s.status == "SUCCEEDED"
    assert_two_steps_one_attempt(s)
    s.ctx.close()


def test_a_media_step_still_running_when_the_fetch_is_redelivered_commits_once(
    tmp_path: Path, sim: SimHandle, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = staged(tmp_path, sim, database_url=pg_url, sweeper={"media_stuck_s": NEVER_S})
    (row,) = pending(s.ctx, FETCH)
    real = type(s.ctx.media)._process
    runs: list[int] = []
    redelivered: list[str] = []

    def stalled(self: Any, *args: Any) -> Any:
        # the first run's media step is under way (files, no transaction) when the broker, thinking the fetch
        # lost, redelivers it to another worker, which runs the same media step to the end
        runs.append(1)
        if len(runs) == 1:
            redelivered.append(s.ctx.output_fetch.handle(envelope(row)))
        return real(self, *args)

    monkeypatch.setattr(type(s.ctx.media), "_process", stalled)

    first = s.ctx.output_fetch.handle(envelope(row))

    assert len(runs) == 2 and redelivered == ["media: succeeded"]
    assert first == "stored 1; media: duplicate"  # the same step, one inbox row: recorded once
    assert s.status == "SUCCEEDED"
    assert_two_steps_one_attempt(s)
    assert len(inbox(s, "media")) == 1
    s.ctx.close()


def test_a_redelivered_fetch_leaves_a_queued_media_step_to_its_queue(tmp_path: Path, sim: SimHandle) -> None:
    s = staged(tmp_path, sim, media={"inline_after_fetch_max_bytes": len(sample_mp4()) - 1})
    (row,) = pending(s.ctx, FETCH)
    assert s.fetch() == "stored 1"

    assert s.ctx.output_fetch.handle(envelope(row)) == "skipped: task is POST_PROCESSING"

    assert len(pending(s.ctx, MEDIA)) == 1 and inbox(s, "media") == []
    s.ctx.close()
