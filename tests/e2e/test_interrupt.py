"""Ctrl-C during `aivedio generate --wait` (embedded) leaves the task unharmed, whatever stage it is in.

As a terminal does, the test sends SIGINT to the command's whole process group (`os.killpg`; the command runs
in its own session so the group is exactly its own). The command must stop following, print one line saying
how to follow the task again, and exit 130 — its engine shutting down gracefully, nothing marked failed, no
ffmpeg left behind. Then the same command with the same idempotency key hosts the embedded engine again on
the same data dir: it resumes the task (pending outbox rows, the media retry, the local provider's answer for
a render the first process stopped) and must see it SUCCEED.

Each stage is held deterministically while the signal is sent: a `sleep` failpoint (armed through the
environment, its hits logged) for the short stages, the real ffmpeg child for the render and the media step.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TERMINAL = {"SUCCEEDED", "FAILED_FINAL", "CANCELED", "EXPIRED"}
#: shorter polling and sweeping than the defaults, so the resumed run does not sit out 5-10 s waits
FAST = ("--set", "polling.min_interval_s=1", "--set", "polling.max_interval_s=2", "--set", "sweeper.interval_s=1")


@dataclass(frozen=True)
class Stage:
    status: tuple[str, ...]
    #: `name=sleep:S` armed in the interrupted run; the signal goes out while it sleeps
    failpoint: str | None = None
    #: or: wait for a child of the command whose argv passes this test
    child: Callable[[str], bool] | None = None
    duration: str = "2"
    resolution: str = "360p"
    #: outputs asked for (`--n`): every variant must arrive after the interrupt, and be the only ones charged
    n: int = 1


def _render(argv: str) -> bool:
    return "ffmpeg" in argv and "-progress" in argv


def _media(argv: str) -> bool:
    return ("ffmpeg" in argv or "ffprobe" in argv) and "-progress" not in argv


STAGES = {
    "QUEUED": Stage(("QUEUED",), failpoint="dispatch.after_acquire=sleep:3"),
    "DISPATCHING": Stage(("DISPATCHING",), failpoint="submit.before_call=sleep:3"),
    "RUNNING": Stage(("SUBMITTED", "RUNNING"), child=_render, duration="10"),  # a render of ~10 s realtime
    "RUNNING_N3": Stage(("SUBMITTED", "RUNNING"), child=_render, duration="4", n=3),
    "OUTPUT_FETCHING": Stage(("OUTPUT_FETCHING",), failpoint="local.serve_output=sleep:3"),
    "POST_PROCESSING": Stage(("POST_PROCESSING",), child=_media, duration="10", resolution="720p"),
}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return {**env, **extra}


def _argv(data: Path, stage: Stage, key: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "aivedio_cli",
        "--set",
        f"data_dir={data}",
        *FAST,
        "generate",
        "a heron lifting off a misty lake",
        "--duration",
        stage.duration,
        "--resolution",
        stage.resolution,
        "--idempotency-key",
        key,
        *(("--n", str(stage.n)) if stage.n > 1 else ()),
        "--wait",
        "--json",
        "--timeout",
        "240",
    ]


def _status(db: Path) -> tuple[str, str | None] | None:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            row = conn.execute("SELECT status, last_error_code FROM generation_tasks").fetchone()
    except sqlite3.Error:
        return None  # not created yet, or locked for a moment
    return None if row is None else (row[0], row[1])


def _children(pid: int) -> dict[int, str]:
    """Direct children of `pid` and their command lines."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _until(check: Callable[[], object], what: str, proc: subprocess.Popen[str], timeout_s: float = 120) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the command ended (rc {proc.returncode}) before {what}:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(STAGES))
def test_ctrl_c_in_each_stage_leaves_the_task_to_succeed_later(tmp_path: Path, name: str) -> None:
    stage = STAGES[name]
    data, db, hits = tmp_path / "data", tmp_path / "data" / "aivedio.db", tmp_path / "failpoints.log"
    key = f"interrupt-{name.lower()}"
    env = _env(
        **({"AIVEDIO_FAILPOINTS": stage.failpoint, "AIVEDIO_FAILPOINTS_LOG": str(hits)} if stage.failpoint else {})
    )
    cmd = subprocess.Popen(
        _argv(data, stage, key),
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        seen: dict[int, str] = {}
        if stage.failpoint:
            point = stage.failpoint.split("=")[0]
            _until(lambda: hits.exists() and f" {point} " in hits.read_text(), f"failpoint {point}", cmd)
        else:
            assert stage.child is not None
            test = stage.child

            def child_in_stage() -> bool:
                now = _status(db)
                if now is None or now[0] not in stage.status:
                    return False
                seen.update({p: a for p, a in _children(cmd.pid).items() if test(a)})
                return bool(seen)

            _until(child_in_stage, f"an ffmpeg child in {name}", cmd)
        at_signal = _status(db)
        assert at_signal is not None and at_signal[0] in stage.status, at_signal
        os.killpg(cmd.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, err = cmd.communicate(timeout=90)
    finally:
        if cmd.poll() is None:
            os.killpg(cmd.pid, signal.SIGKILL)
            cmd.wait()

    assert cmd.returncode == 130, err[-3000:]
    doc = json.loads(out)
    assert doc["interrupted"] is True and doc["id"]
    lines = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert lines == [f"interrupted — the task continues; follow it with `aivedio generations wait {doc['id']}`"]
    assert "Traceback" not in err, err[-3000:]
    after = _status(db)
    assert after is not None and after[0] not in TERMINAL, after  # unharmed: nothing was failed on the way out
    assert not [p for p in seen if _alive(p)], "an ffmpeg child outlived the command"
    if name == "POST_PROCESSING":  # the encode was stopped mid-way and its step scheduled again, not failed
        assert after == ("POST_PROCESSING", "media_interrupted"), after
    if name.startswith("RUNNING"):  # the render was stopped and its job released, for the next engine to render again
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            assert conn.execute("SELECT state, owner FROM local_jobs").fetchall() == [("queued", None)]

    resumed = subprocess.run(
        _argv(data, stage, key), env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = json.loads(resumed.stdout)
    assert final["id"] == doc["id"] and final["status"] == "SUCCEEDED", final
    assert {"proxy_mp4", "hls", "thumbnail"} <= final["outputs"].keys()
    for where in final["outputs"].values():
        assert Path(where).is_file() and Path(where).stat().st_size > 0
    if name.startswith("RUNNING"):  # rendered again under the same job: no second attempt
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            assert conn.execute("SELECT count(*) FROM task_attempts").fetchone() == (1,)
    # money follows delivery: every variant asked for arrived, and the charge is for what arrived
    assert len(final.get("variants") or [None]) == stage.n, final.get("variants")
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
        raws = conn.execute("SELECT count(DISTINCT output_index) FROM assets WHERE kind = 'RAW_OUTPUT'").fetchone()
        entries = conn.execute(
            "SELECT entry_type, amount FROM credit_ledger WHERE task_id IS NOT NULL ORDER BY created_at, id"
        ).fetchall()
        cost = conn.execute("SELECT estimated_cost, actual_cost FROM generation_tasks").fetchone()
    assert raws == (stage.n,)
    assert [t for t, _ in entries] == ["RESERVE", "SETTLE"], entries
    assert float(entries[1][1]) == 0 and float(cost[1]) == float(cost[0]) == -float(entries[0][1]), (entries, cost)


def _task_count(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return int(conn.execute("SELECT count(*) FROM generation_tasks").fetchone()[0])
    except sqlite3.Error:
        return 0


@pytest.mark.timeout(600)
def test_ctrl_c_in_batch_run_submits_nothing_more_and_a_re_run_finishes_the_batch(tmp_path: Path) -> None:
    data, db = tmp_path / "data", tmp_path / "data" / "aivedio.db"
    batch = tmp_path / "batch.jsonl"
    batch.write_text(
        "".join(json.dumps({"prompt": f"lantern {i}", "duration_s": 2, "resolution": "360p"}) + "\n" for i in range(3))
    )
    out = tmp_path / "results.jsonl"
    argv = [
        sys.executable,
        "-m",
        "aivedio_cli",
        "--set",
        f"data_dir={data}",
        *FAST,
        "batch",
        "run",
        str(batch),
        "--concurrency",
        "2",
        "--out",
        str(out),
        "--json",
    ]
    cmd = subprocess.Popen(
        argv,
        env=_env(),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _until(lambda: _task_count(db) == 2, "two tasks submitted", cmd)
        os.killpg(cmd.pid, signal.SIGINT)
        stdout, err = cmd.communicate(timeout=90)
    finally:
        if cmd.poll() is None:
            os.killpg(cmd.pid, signal.SIGKILL)
            cmd.wait()

    assert cmd.returncode == 130, err[-3000:]
    summary = json.loads(stdout)
    assert summary["interrupted"] == 3 and summary["failed"] == 0
    assert [r["status"] for r in summary["results"]][2] == "NOT_SUBMITTED"
    lines = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert lines == [
        f"interrupted — the 2 unfinished task(s) continue; run `aivedio batch run {batch}` again to "
        "follow them and submit the rest (nothing is submitted twice)"
    ]
    assert out.read_text() == ""  # no task ended, so no result line was written
    assert _task_count(db) == 2  # nothing was submitted after Ctrl-C

    rerun = subprocess.run(
        [*argv[:-1], "--json"], env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    again = json.loads(rerun.stdout)
    assert again["succeeded"] == 3 and again["resumed"] == 2 and _task_count(db) == 3
