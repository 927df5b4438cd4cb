"""Embedded mode never strands a task: whatever ended the command that hosted the engine, the next command that
hosts it (`generations wait`, `serve`, `batch run`, `generate --wait`) finishes every unfinished task of the
data dir, and a render cut short is rendered again under the same provider job — one attempt, one RESERVE,
one SETTLE.

Real processes on a real data dir (SQLite, the `local` ffmpeg provider), as in test_interrupt.py.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_interrupt import FAST, _alive, _children, _env, _media, _render, _until

HINT = "queued; it runs while an engine runs: `aivedio generations wait {id}` or `aivedio serve`"


def _cli(data: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "aivedio_cli", "--set", f"data_dir={data}", *FAST, *args]


def _run(data: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _cli(data, *args), env=_env(), cwd=data.parent, capture_output=True, text=True, timeout=timeout
    )


def _rows(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        return conn.execute(sql, params).fetchall()


def _queue(data: Path, prompt: str, *options: str) -> str:
    """`aivedio generate` without --wait: the task is queued, and the command says how it will run."""
    run = _run(data, "generate", prompt, *options, "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(run.stdout)  # stdout holds the JSON only; the hint went to stderr
    assert doc["status"] == "QUEUED", doc
    assert HINT.format(id=doc["id"]) in run.stderr.splitlines(), run.stderr
    return str(doc["id"])


def _status(db: Path, task_id: str) -> str | None:
    try:
        rows = _rows(db, "SELECT status FROM generation_tasks WHERE lower(replace(id, '-', '')) = ?", _hex(task_id))
    except sqlite3.Error:
        return None
    return rows[0][0] if rows else None


def _hex(task_id: str) -> str:
    return task_id.replace("-", "").lower()


def _ledger(db: Path, task_id: str) -> list[str]:
    rows = _rows(db, "SELECT entry_type FROM credit_ledger WHERE lower(replace(task_id, '-', '')) = ?", _hex(task_id))
    return sorted(r[0] for r in rows)


def test_generate_without_wait_says_how_the_task_runs_and_generations_wait_runs_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    tid = _queue(data, "a paper boat on a pond", "--duration", "2")
    assert _status(data / "aivedio.db", tid) == "QUEUED"  # no engine ran: nothing moved it, nothing rendered

    people = _run(data, "generate", "a second boat", "--duration", "1")  # without --json: the same one line
    assert people.returncode == 0, people.stderr[-3000:]
    assert [ln for ln in people.stderr.splitlines() if ln.startswith("queued;")] == [
        HINT.format(id=people.stderr.split("task ", 1)[1].split()[0])
    ]

    waited = _run(data, "generations", "wait", tid, "--json")
    assert waited.returncode == 0, waited.stderr[-3000:]
    assert json.loads(waited.stdout)["status"] == "SUCCEEDED"


def test_generate_wait_timing_out_gives_the_same_hint(tmp_path: Path) -> None:
    data = tmp_path / "data"
    run = _run(data, "generate", "a slow tide", "--duration", "10", "--resolution", "720p", "--wait", "--timeout", "1")
    assert run.returncode == 1, run.stderr[-3000:]
    tid = run.stderr.split("task ", 1)[1].split()[0]
    status = _status(data / "aivedio.db", tid)
    assert status not in (None, "SUCCEEDED", "FAILED_FINAL")
    lines = [ln for ln in run.stderr.splitlines() if "it runs while an engine runs" in ln]
    # one line, the CLI's error convention: it timed out, and how the task goes on
    assert len(lines) == 1 and lines[0].startswith("error: timed out after 1s: generation "), run.stderr
    assert lines[0].endswith(f"`aivedio generations wait {tid}` or `aivedio serve`")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("recorded", [True, False], ids=["submit_recorded", "submit_not_yet_recorded"])
def test_a_render_killed_hard_is_rendered_again_under_the_same_job(tmp_path: Path, recorded: bool) -> None:
    """Killed after the engine recorded the submit (SUBMITTED/RUNNING), or while the render already ran but the
    submit's answer was not yet recorded (DISPATCHING: the next engine finds the job by its request key)."""
    data, db, hits = tmp_path / "data", tmp_path / "data" / "aivedio.db", tmp_path / "failpoints.log"
    held = {"AIVEDIO_FAILPOINTS": "submit.after_call=sleep:30", "AIVEDIO_FAILPOINTS_LOG": str(hits)}
    expected = ("SUBMITTED", "RUNNING") if recorded else ("DISPATCHING",)
    host = subprocess.Popen(
        _cli(data, "generate", "a kite over dunes", "--duration", "10", "--resolution", "720p", "--wait", "--json"),
        env=_env(**({} if recorded else held)),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    renders: dict[int, str] = {}
    try:

        def rendering() -> bool:
            renders.update({p: a for p, a in _children(host.pid).items() if _render(a)})
            try:  # and the job's row says so: the kill lands mid-render, not between spawn and its record
                if not recorded and not (hits.exists() and " submit.after_call " in hits.read_text()):
                    return False
                return (
                    bool(renders)
                    and _rows(db, "SELECT state FROM local_jobs") == [("running",)]
                    and _rows(db, "SELECT status FROM generation_tasks")[0][0] in expected
                )
            except sqlite3.Error:
                return False

        _until(rendering, "the render's ffmpeg", host)
        os.killpg(host.pid, signal.SIGKILL)  # the hosting command, killed hard: nothing runs its `finally`
        for pid in renders:
            try:
                os.kill(pid, signal.SIGKILL)  # and its renderer (in a session of its own, so not in the group)
            except ProcessLookupError:
                pass  # already taken down with its parent (the sandbox's parent-death signal)
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
        host.communicate()
    _wait_gone(renders)

    [(task_id, status)] = _rows(db, "SELECT id, status FROM generation_tasks")
    assert status in expected, status
    [(job_id, state, owner, renders_before)] = _rows(db, "SELECT job_id, state, owner, renders FROM local_jobs")
    assert state == "running" and owner is not None and renders_before == 1  # as the dead process left it

    tid = str(uuid.UUID(task_id))
    waited = _run(data, "generations", "wait", tid, "--json")
    assert waited.returncode == 0, waited.stderr[-3000:]
    assert json.loads(waited.stdout)["status"] == "SUCCEEDED"
    assert _rows(db, "SELECT provider_job_id FROM task_attempts") == [(job_id,)]  # one attempt, the same job
    assert _rows(db, "SELECT state, renders FROM local_jobs") == [("succeeded", 2)]
    assert _ledger(db, tid) == ["RESERVE", "SETTLE"]


@pytest.mark.timeout(600)
def test_a_command_killed_hard_while_fetching_the_output_leaves_it_to_the_next_one(tmp_path: Path) -> None:
    """The finished render is reused, not rendered again, though the URL the engine held names the dead
    process's loopback port: the next engine asks the provider for a fresh one."""
    data, db, hits = tmp_path / "data", tmp_path / "data" / "aivedio.db", tmp_path / "failpoints.log"
    host = subprocess.Popen(
        _cli(data, "generate", "a kite over dunes", "--duration", "2", "--wait", "--json"),
        env=_env(AIVEDIO_FAILPOINTS="local.serve_output=sleep:30", AIVEDIO_FAILPOINTS_LOG=str(hits)),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:  # held while the engine downloads the output
        _until(lambda: hits.exists() and " local.serve_output " in hits.read_text(), "the output download", host)
        os.killpg(host.pid, signal.SIGKILL)
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
        host.communicate()
    [(task_id, status)] = _rows(db, "SELECT id, status FROM generation_tasks")
    assert status == "OUTPUT_FETCHING", status

    tid = str(uuid.UUID(task_id))
    waited = _run(data, "generations", "wait", tid, "--json")
    assert waited.returncode == 0, waited.stderr[-3000:]
    assert json.loads(waited.stdout)["status"] == "SUCCEEDED"
    assert _rows(db, "SELECT count(*) FROM task_attempts") == [(1,)]
    assert _rows(db, "SELECT state, renders FROM local_jobs") == [("succeeded", 1)]  # served again, not re-rendered
    assert _ledger(db, tid) == ["RESERVE", "SETTLE"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage", ["QUEUED", "POST_PROCESSING"])
def test_a_command_killed_hard_in_other_stages_leaves_the_task_to_the_next_one(tmp_path: Path, stage: str) -> None:
    data, db, hits = tmp_path / "data", tmp_path / "data" / "aivedio.db", tmp_path / "failpoints.log"
    held = {"AIVEDIO_FAILPOINTS": "dispatch.after_acquire=sleep:30", "AIVEDIO_FAILPOINTS_LOG": str(hits)}
    host = subprocess.Popen(
        _cli(data, "generate", "a kite over dunes", "--duration", "10", "--resolution", "720p", "--wait"),
        env=_env(**(held if stage == "QUEUED" else {})),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    media: dict[int, str] = {}
    try:
        if stage == "QUEUED":
            _until(lambda: hits.exists() and " dispatch.after_acquire " in hits.read_text(), "the dispatch", host)
        else:

            def encoding() -> bool:
                if _rows_or_none(db, "SELECT status FROM generation_tasks") != [("POST_PROCESSING",)]:
                    return False
                media.update({p: a for p, a in _children(host.pid).items() if _media(a)})
                return bool(media)

            _until(encoding, "a media child", host)
        os.killpg(host.pid, signal.SIGKILL)
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGKILL)
        host.communicate()
    _wait_gone(media)
    [(task_id, status)] = _rows(db, "SELECT id, status FROM generation_tasks")
    assert status == stage, status

    tid = str(uuid.UUID(task_id))
    waited = _run(data, "generations", "wait", tid, "--json", "--timeout", "240")
    assert waited.returncode == 0, waited.stderr[-3000:]
    assert json.loads(waited.stdout)["status"] == "SUCCEEDED"
    assert _rows(db, "SELECT count(*) FROM task_attempts") == [(1,)]
    assert _ledger(db, tid) == ["RESERVE", "SETTLE"]


def _rows_or_none(db: Path, sql: str) -> list[tuple[Any, ...]] | None:
    try:
        return _rows(db, sql)
    except sqlite3.Error:
        return None


def _wait_gone(pids: dict[int, str], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in pids):
        assert time.monotonic() < deadline, "a killed renderer is still alive"
        time.sleep(0.02)


def _serve_until(data: Path, check: Callable[[], bool], what: str) -> None:
    serve = subprocess.Popen(
        _cli(data, "serve", "--role", "relay,worker,scheduler,sweeper"),
        env=_env(),
        cwd=data.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _until(check, what, serve, timeout_s=240)
        serve.send_signal(signal.SIGTERM)
        _, err = serve.communicate(timeout=60)
        assert serve.returncode == 0, err[-3000:]
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.communicate()


@pytest.mark.timeout(600)
def test_serve_batch_run_and_generate_wait_resume_every_unfinished_task(tmp_path: Path) -> None:
    data, db = tmp_path / "data", tmp_path / "data" / "aivedio.db"
    first, second = _queue(data, "lanterns on a river", "--duration", "1"), _queue(data, "a fox", "--duration", "1")
    _serve_until(data, lambda: _status(db, first) == _status(db, second) == "SUCCEEDED", "serve to finish both")

    third = _queue(data, "a heron", "--duration", "1")
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps({"prompt": "rain on a window", "duration_s": 6, "resolution": "720p"}) + "\n")
    run = _run(data, "batch", "run", str(batch), "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout)["succeeded"] == 1
    assert _status(db, third) == "SUCCEEDED"  # not in the batch's file: resumed by the engine the batch hosted

    fourth = _queue(data, "a lighthouse", "--duration", "1")
    own = _run(data, "generate", "snow on pines", "--duration", "6", "--resolution", "720p", "--wait", "--json")
    assert own.returncode == 0 and json.loads(own.stdout)["status"] == "SUCCEEDED", own.stderr[-3000:]
    assert _status(db, fourth) == "SUCCEEDED"  # queued earlier by another command: resumed by generate --wait
    for task in (first, second, third, fourth):
        assert _ledger(db, task) == ["RESERVE", "SETTLE"], task
