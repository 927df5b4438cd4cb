"""`aivedio generations get|wait|list|download|cancel` and `aivedio models list`, run as a user runs them (the real
CLI in a subprocess) in both modes: embedded (the engine's data dir; `wait` hosts the engine so the task moves)
and remote (`--api-url` / AIVEDIO_API_URL against the real API on a loopback port).

Downloads are checked twice: the command compares each file with its asset row, and the test compares the
bytes it finds on disk with the rows it reads from the database itself."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import assets, credit_ledger
from aivedio_engine.worker.runtime import Runtime
from tests.e2e.support import ffprobe_duration, sample_png
from tests.support.app import make_context, running_api, tenant_with_key

ORDER = ["QUEUED", "DISPATCHING", "SUBMITTED", "RUNNING", "OUTPUT_FETCHING", "POST_PROCESSING", "SUCCEEDED"]
DERIVATIVES = {"proxy_mp4", "hls", "thumbnail", "waveform"}


def _aivedio(
    *args: str, data: Path | None = None, env: dict[str, str] | None = None, cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    prefix = ["--set", f"data_dir={data}"] if data else []
    return subprocess.run(
        [sys.executable, "-m", "aivedio_cli", *prefix, *args],
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def _ok(run: subprocess.CompletedProcess[str]) -> Any:
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def _error_line(run: subprocess.CompletedProcess[str]) -> str:
    lines = run.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), run.stderr[-2000:]
    return lines[-1]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _recorded(ctx: AppContext, task_id: str) -> dict[str, str]:
    """profile (or "original") → the sha256 on the task's asset rows, read straight from the database."""
    a = assets.c
    with ctx.engine.connect() as conn:
        rows = conn.execute(
            sa.select(a.kind, a.profile, a.checksum_algorithm, a.checksum_value).where(
                a.task_id == uuid.UUID(task_id), a.status == "READY"
            )
        ).all()
    assert all(r.checksum_algorithm == "sha256" for r in rows)
    return {("original" if r.kind == "RAW_OUTPUT" else r.profile): r.checksum_value for r in rows}


def _check_download(doc: dict[str, Any], out: Path, recorded: dict[str, str], *, original: bool) -> None:
    """Every file is on disk with the bytes its asset row recorded, and the HLS folder plays offline."""
    assert doc["ok"] is True and doc["out"] == str(out)
    mains = {f["profile"]: Path(f["path"]) for f in doc["files"] if f["expected_sha256"] is not None}
    assert set(mains) == DERIVATIVES | ({"original"} if original else set())
    for profile, path in mains.items():
        assert path.is_file() and path.parent in (out, out / "hls")
        assert _sha256(path) == recorded[profile], profile
    assert mains["hls"] == out / "hls" / "index.m3u8"
    playlist = mains["hls"].read_text()
    named = [ln for ln in playlist.splitlines() if ln and not ln.startswith("#")]
    assert named and all((out / "hls" / n).is_file() for n in named) and "sig=" not in playlist
    segments = [f for f in doc["files"] if f["profile"] == "hls" and f["expected_sha256"] is None]
    assert {Path(f["path"]).name for f in segments} >= set(named) | {"init.mp4"}
    assert all(_sha256(Path(f["path"])) == f["sha256"] for f in segments)
    assert 1.5 < ffprobe_duration(mains["hls"]) < 3
    assert 1.5 < ffprobe_duration(mains["proxy_mp4"]) < 3
    assert not list(out.rglob("*.part"))


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _stored(ctx: AppContext, task_id: str, profile: str) -> Path:
    root = Path(ctx.settings.data_dir) / "objects"
    a = assets.c
    with ctx.engine.connect() as conn:
        key = conn.execute(
            sa.select(a.object_key).where(a.task_id == uuid.UUID(task_id), a.profile == profile)
        ).scalar_one()
    return root / key


@pytest.mark.timeout(600)
def test_embedded_generate_then_wait_get_list_download(tmp_path: Path) -> None:
    data = tmp_path / "data"
    image = sample_png(tmp_path / "ref.png")
    made = _ok(
        _aivedio(
            "generate", "a red fox in snow", "--image", str(image), "--duration", "2", "--json", data=data, cwd=tmp_path
        )
    )
    tid = made["id"]
    assert made["status"] not in ("SUCCEEDED", "FAILED_FINAL")

    run = _aivedio("generations", "wait", tid, "--json", data=data, cwd=tmp_path)
    waited = _ok(run)
    assert waited["status"] == "SUCCEEDED" and waited["id"] == tid
    assert DERIVATIVES <= waited["outputs"].keys()
    # the live display of `generate --wait`: one line per state change, in the machine's order, to SUCCEEDED
    shown = [ln.strip() for ln in run.stderr.splitlines() if ln.strip() in ORDER]
    assert shown[-1] == "SUCCEEDED" and shown == sorted(shown, key=ORDER.index) and len(shown) >= 2

    got = _ok(_aivedio("generations", "get", tid, "--json", data=data, cwd=tmp_path))
    assert (got["status"], got["version"], got["outputs"]) == ("SUCCEEDED", waited["version"], waited["outputs"])
    assert got["model"] == "local-v1" and got["provider"] == "local" and got["finished_at"]
    people = _aivedio("generations", "get", tid, data=data, cwd=tmp_path)
    assert people.returncode == 0 and "status    SUCCEEDED" in people.stdout

    ctx = make_context(data)
    try:
        recorded = _recorded(ctx, tid)
        out = tmp_path / "out"
        doc = _ok(_aivedio("generations", "download", tid, "--out", str(out), "--json", data=data, cwd=tmp_path))
        _check_download(doc, out, recorded, original=True)
        assert (out / "original.mp4").read_bytes()[4:8] == b"ftyp" and doc["notes"] == []

        listed = _ok(_aivedio("generations", "list", "--json", data=data, cwd=tmp_path))
        assert [g["id"] for g in listed["data"]] == [tid]
        done = _ok(_aivedio("generations", "list", "--status", "SUCCEEDED", "--json", data=data, cwd=tmp_path))
        queued = _ok(_aivedio("generations", "list", "--status", "queued", "--json", data=data, cwd=tmp_path))
        assert [g["id"] for g in done["data"]] == [tid] and queued["data"] == []
        bogus = _aivedio("generations", "list", "--status", "DONE", data=data, cwd=tmp_path)
        assert bogus.returncode == 2 and "unknown status 'DONE' (known: CREATED," in _error_line(bogus)

        finished = _aivedio("generations", "cancel", tid, data=data, cwd=tmp_path)
        assert finished.returncode == 4 and "SUCCEEDED" in _error_line(finished)

        # a stored derivative no longer matches its row: the download says which, and does not keep it
        _flip_a_byte(_stored(ctx, tid, "proxy_mp4"))
        bad_out = tmp_path / "bad"
        bad = _aivedio("generations", "download", tid, "--out", str(bad_out), data=data, cwd=tmp_path)
        assert bad.returncode == 1
        line = _error_line(bad)
        assert "proxy.mp4" in line and "checksum" in line and "recorded" in line
        assert not (bad_out / "proxy.mp4").exists() and (bad_out / "thumbnail.jpg").is_file()
        assert _sha256(bad_out / "thumbnail.jpg") == recorded["thumbnail"]
    finally:
        ctx.close()


def test_embedded_cancel_of_a_queued_task_and_one_line_errors(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ctx = make_context(data)
    try:
        local = ctx.tenants.local_principal()
        # made without any engine running: it stays QUEUED until someone cancels it
        task = ctx.generations.create(
            local.tenant_id, "queued-1", {"prompt": "still water", "model": "local-v1", "duration_s": 2}
        ).task
        assert task.status == "QUEUED"
        tid = str(task.id)
        listed = _ok(_aivedio("generations", "list", "--status", "QUEUED", "--json", data=data, cwd=tmp_path))
        assert [g["id"] for g in listed["data"]] == [tid]

        canceled = _ok(_aivedio("generations", "cancel", tid, "--json", data=data, cwd=tmp_path))
        assert canceled["status"] == "CANCELED" and canceled["version"] > task.version
        again = _ok(_aivedio("generations", "cancel", tid, "--json", data=data, cwd=tmp_path))
        assert again["status"] == "CANCELED" and again["version"] == canceled["version"]
        with ctx.engine.connect() as conn:
            entries = conn.execute(
                sa.select(credit_ledger.c.entry_type, credit_ledger.c.amount).where(credit_ledger.c.task_id == task.id)
            ).all()
        assert sorted(e.entry_type for e in entries) == ["RELEASE", "RESERVE"] and sum(e.amount for e in entries) == 0

        waited = _aivedio("generations", "wait", tid, "--json", data=data, cwd=tmp_path)
        assert waited.returncode == 1 and json.loads(waited.stdout)["status"] == "CANCELED"
        not_ready = _aivedio("generations", "download", tid, "--out", str(tmp_path / "o"), data=data, cwd=tmp_path)
        assert not_ready.returncode == 4 and "only a SUCCEEDED generation" in _error_line(not_ready)
        assert not (tmp_path / "o").exists()
    finally:
        ctx.close()

    unknown = str(uuid.uuid4())
    for verb in ("get", "wait", "cancel", "download"):
        run = _aivedio("generations", verb, unknown, data=data, cwd=tmp_path)
        assert run.returncode == 5, (verb, run.stderr)
        assert _error_line(run) == f"error: generation {unknown} not found"
    not_an_id = _aivedio("generations", "get", "nope", data=data, cwd=tmp_path)
    assert not_an_id.returncode == 2 and _error_line(not_an_id) == "error: not a generation id: 'nope'"

    models = _ok(_aivedio("models", "list", "--json", data=data, cwd=tmp_path))
    local = next(m for m in models["data"] if m["model"] == "local-v1")
    assert local["provider"] == "local" and local["max_duration_s"] == 10
    assert local["price_per_second"] == {"360p": "0.5", "720p": "1"}
    table = _aivedio("models", "list", data=data, cwd=tmp_path)
    assert table.returncode == 0 and "local-v1" in table.stdout and "720p: 1" in table.stdout
    wrong = _aivedio("models", "list", "--provider", "acme", data=data, cwd=tmp_path)
    assert wrong.returncode == 2 and _error_line(wrong) == "error: unknown provider 'acme' (known: local)"


@pytest.mark.timeout(600)
def test_remote_verbs_against_the_api_on_a_loopback_port(tmp_path: Path) -> None:
    ctx = make_context(
        tmp_path / "server",
        polling={"min_interval_s": 1, "max_interval_s": 2, "jitter": 0},
        sweeper={"interval_s": 0.5},
    )
    who = tenant_with_key(ctx, "alice", credits=100)
    image = sample_png(tmp_path / "ref.png")
    runtime = Runtime(ctx, {"relay", "worker", "scheduler", "sweeper"}, threading.Event())
    try:
        with running_api(ctx) as base:
            env = {"AIVEDIO_API_URL": base, "AIVEDIO_API_KEY": who.key}
            flags = ["--api-url", base, "--api-key", who.key]

            # the API alone, no engine roles yet: what is created stays QUEUED
            queued = _ok(_aivedio("generate", "a quiet lake", "--duration", "1", "--json", env=env, cwd=tmp_path))
            qid = queued["id"]
            slow = _aivedio("generations", "wait", qid, "--timeout", "1", "--json", env=env, cwd=tmp_path)
            assert slow.returncode == 1 and json.loads(slow.stdout)["status"] == "QUEUED"
            assert _error_line(slow).startswith(f"error: timed out after 1s: generation {qid} is still QUEUED")
            canceled = _ok(_aivedio("generations", "cancel", qid, "--json", *flags, cwd=tmp_path))
            assert canceled["status"] == "CANCELED"
            assert _ok(_aivedio("generations", "cancel", qid, "--json", env=env, cwd=tmp_path))["status"] == "CANCELED"
            listed = _ok(_aivedio("generations", "list", "--status", "CANCELED", "--json", env=env, cwd=tmp_path))
            assert [g["id"] for g in listed["data"]] == [qid]

            unknown = str(uuid.uuid4())
            missing = _aivedio("generations", "get", unknown, env=env, cwd=tmp_path)
            assert missing.returncode == 5
            assert _error_line(missing) == f"error: HTTP 404: generation {unknown} not found"
            bad_key = _aivedio("generations", "list", "--api-url", base, "--api-key", "avk_wrong", cwd=tmp_path)
            assert bad_key.returncode == 1 and _error_line(bad_key).startswith("error: HTTP 401")
            no_key = _aivedio("generations", "list", "--api-url", base, cwd=tmp_path)
            assert no_key.returncode == 2 and "--api-key" in _error_line(no_key)
            models = _ok(_aivedio("models", "list", "--json", env=env, cwd=tmp_path))
            assert [m["model"] for m in models["data"]] == ["local-v1"]

            runtime.start()
            made = _ok(
                _aivedio(
                    "generate",
                    "waves on a beach",
                    "--image",
                    str(image),
                    "--duration",
                    "2",
                    "--json",
                    *flags,
                    cwd=tmp_path,
                )
            )
            tid = made["id"]
            run = _aivedio("generations", "wait", tid, "--json", env=env, cwd=tmp_path)
            waited = _ok(run)
            assert waited["status"] == "SUCCEEDED" and DERIVATIVES <= waited["outputs"].keys()
            assert all(u.startswith(base) for u in waited["outputs"].values())
            assert [ln.strip() for ln in run.stderr.splitlines() if ln.strip() in ORDER][-1] == "SUCCEEDED"
            got = _ok(_aivedio("generations", "get", tid, "--json", env=env, cwd=tmp_path))
            assert got["status"] == "SUCCEEDED" and got["version"] == waited["version"]

            recorded = _recorded(ctx, tid)
            out = tmp_path / "out"
            doc = _ok(_aivedio("generations", "download", tid, "--out", str(out), "--json", env=env, cwd=tmp_path))
            _check_download(doc, out, recorded, original=False)
            assert not (out / "original.mp4").exists() and "original: not served over the API" in doc["notes"][0]

            assert _aivedio("generations", "cancel", tid, env=env, cwd=tmp_path).returncode == 4
            newest = _ok(_aivedio("generations", "list", "--limit", "1", "--json", env=env, cwd=tmp_path))
            assert [g["id"] for g in newest["data"]] == [tid]

            _flip_a_byte(_stored(ctx, tid, "thumbnail"))
            bad_out = tmp_path / "bad"
            bad = _aivedio("generations", "download", tid, "--out", str(bad_out), env=env, cwd=tmp_path)
            assert bad.returncode == 1 and "thumbnail.jpg" in _error_line(bad) and "checksum" in _error_line(bad)
            assert not (bad_out / "thumbnail.jpg").exists() and (bad_out / "proxy.mp4").is_file()
    finally:
        runtime.shutdown()
        ctx.close()
