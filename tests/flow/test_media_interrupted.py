"""An interrupted media run (the engine stopping mid-encode, SIGINT/SIGTERM/SIGHUP on a child) is retried, at
once and within the media budget — never a gate rejection, never FAILED_FINAL.

Staged like test_media_pipeline: a sim task in POST_PROCESSING with its media.process.requested row held back;
the test delivers it on a thread and stops the engine's media children (`sandbox.stopping`) while one runs.
A fake `ffmpeg` first on PATH makes the encode last (it sleeps, then runs the real ffmpeg), so the stop
lands mid-encode every time; ffprobe stays the real one.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aivedio_engine.media import sandbox
from aivedio_engine.media.probe import ProbeInterrupted
from aivedio_engine.services import media as media_module
from tests.flow.test_media_pipeline import derivatives, raw_of, reviews, staged
from tests.flow.test_output_fetch import MEDIA, alerts_of, assert_only_reserved, assert_settled, pending, task_row
from tests.support.sim import SimHandle


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory beside the job directories that anyone may enter and write: the sandbox runs each encode as a
    uid of its own, which could neither enter pytest's private tmp_path nor write in it."""
    path = Path(tempfile.mkdtemp(prefix="aivedio-fake-ffmpeg-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _slow_ffmpeg(bin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ffmpeg that says it started (`<bin>/started`, one line per run), sleeps, then runs the real one."""
    real = shutil.which("ffmpeg")
    assert real is not None
    fake = bin_dir / "ffmpeg"
    started = fake.parent / "started"
    fake.write_text(f'#!/bin/sh\necho run >> {started}\nsleep 30\nexec {real} "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{Path(real).parent}:/usr/bin:/bin")
    return started


def _media_stopped_mid_encode(s: Any, started: Path) -> str:
    runs = started.read_text().count("run") if started.exists() else 0
    out: list[str] = []
    runner = threading.Thread(target=lambda: out.append(s.media()), daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    # the first encode (after the real probe) is running
    while not started.exists() or started.read_text().count("run") == runs:
        assert runner.is_alive() and time.monotonic() < deadline, "no encode started"
        time.sleep(0.005)
    with sandbox.stopping() as stopped:
        runner.join(30)
    assert stopped == 1 and not runner.is_alive()
    return out[0]


def test_an_encode_interrupted_by_a_shutdown_is_retried_at_once_and_then_succeeds(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch, open_dir: Path
) -> None:
    s = staged(tmp_path, sim, retry={"media": {"max_attempts": 3, "base_delay_s": 60, "max_delay_s": 60}})
    started = _slow_ffmpeg(open_dir, monkeypatch)

    result = _media_stopped_mid_encode(s, started)

    assert result.startswith("retry: interrupted: proxy_mp4: ffmpeg interrupted"), result
    task = task_row(s.ctx, s.task_id)
    assert task.status == "POST_PROCESSING"
    assert (task.last_error_class, task.last_error_code) == ("media_worker_crashed", "media_interrupted")
    (retry,) = pending(s.ctx, MEDIA)  # due now, despite a 60 s base delay: a stop is nothing to back off from
    assert retry.payload["try"] == 2
    assert raw_of(s).status == "READY"  # the output passed the gate; nothing about it was judged
    assert all(d.status == "FAILED" for d in derivatives(s))
    assert alerts_of(s.ctx) == [] and reviews(s) == []
    assert_only_reserved(s.ctx, s.task_id)

    monkeypatch.undo()  # the real ffmpeg again
    assert s.media() == "succeeded"
    assert task_row(s.ctx, s.task_id).status == "SUCCEEDED"
    assert all(d.status == "READY" for d in derivatives(s))
    assert_settled(s.ctx, s.task_id)
    s.ctx.close()


def test_interruptions_spend_the_media_budget_and_end_with_a_human_not_a_failure(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch, open_dir: Path
) -> None:
    s = staged(tmp_path, sim, retry={"media": {"max_attempts": 2}})
    started = _slow_ffmpeg(open_dir, monkeypatch)

    assert _media_stopped_mid_encode(s, started).startswith("retry: ")
    assert _media_stopped_mid_encode(s, started) == "held for review"  # budget spent: media never regenerates

    assert task_row(s.ctx, s.task_id).status == "MANUAL_REVIEW"
    (item,) = reviews(s)
    assert "retry budget spent: 2/2" in item.reason and "interrupted" in item.reason
    assert alerts_of(s.ctx, "media_failed") == []
    s.ctx.close()


def test_an_interrupted_probe_is_retried_without_judging_the_output(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = staged(tmp_path, sim)

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise ProbeInterrupted("probe interrupted by SIGTERM")

    monkeypatch.setattr(media_module, "probe_file", interrupted)
    assert s.media().startswith("retry: interrupted: probe interrupted by SIGTERM")

    task = task_row(s.ctx, s.task_id)
    assert task.status == "POST_PROCESSING" and task.last_error_code == "media_interrupted"
    (retry,) = pending(s.ctx, MEDIA)
    assert retry.payload["try"] == 2
    assert raw_of(s).status == "PROCESSING" and raw_of(s).error is None  # not rejected
    assert derivatives(s) == [] and alerts_of(s.ctx) == []
    s.ctx.close()
