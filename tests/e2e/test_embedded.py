"""Embedded mode end to end, as a user runs it: `aivedio generate --wait --json` and `aivedio batch run` with the
engine inside the command (SQLite, in-process broker, fs store) and the `local` ffmpeg provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.support import ffprobe_duration, sample_png

TASKS = 50


def _aivedio(data_dir: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    return subprocess.run(
        [sys.executable, "-m", "aivedio_cli", "--set", f"data_dir={data_dir}", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=data_dir.parent,
    )


def test_generate_with_a_reference_image_on_a_fresh_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "fresh"  # does not exist yet: the command makes dir, schema and tenant
    image = sample_png(tmp_path / "fox.png")
    run = _aivedio(
        data,
        "generate",
        "a red fox running through snow",
        "--image",
        str(image),
        "--duration",
        "2",
        "--idempotency-key",
        "fox-1",
        "--wait",
        "--json",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(run.stdout)
    assert doc["status"] == "SUCCEEDED" and doc["id"]
    assert {"proxy_mp4", "hls", "thumbnail"} <= doc["outputs"].keys()
    assert 1.5 < ffprobe_duration(Path(doc["outputs"]["proxy_mp4"])) < 3
    assert 1.5 < ffprobe_duration(Path(doc["outputs"]["hls"])) < 3
    assert Path(doc["outputs"]["thumbnail"]).read_bytes()[:3] == b"\xff\xd8\xff"
    # the live progress display went to stderr (every transition, from the history); stdout holds only the JSON
    shown = [line.strip() for line in run.stderr.splitlines()]
    assert [
        s
        for s in ("QUEUED", "DISPATCHING", "SUBMITTED", "OUTPUT_FETCHING", "POST_PROCESSING", "SUCCEEDED")
        if s in shown
    ] == ["QUEUED", "DISPATCHING", "SUBMITTED", "OUTPUT_FETCHING", "POST_PROCESSING", "SUCCEEDED"]

    # the same key again: the original task comes back, nothing is uploaded or created twice
    again = _aivedio(
        data,
        "generate",
        "a red fox running through snow",
        "--image",
        str(image),
        "--duration",
        "2",
        "--idempotency-key",
        "fox-1",
        "--wait",
        "--json",
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["id"] == doc["id"]


def test_generate_reports_bad_input_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "d"
    missing = _aivedio(data, "generate", "x", "--image", str(tmp_path / "nope.png"), "--wait")
    assert missing.returncode == 1 and missing.stderr.strip().splitlines()[-1].startswith("error: ")
    fake = tmp_path / "fake.png"
    fake.write_text("<html>not a picture</html>")
    rejected = _aivedio(data, "generate", "x", "--image", str(fake), "--wait")
    assert rejected.returncode == 1 and "rejected" in rejected.stderr
    bad_model = _aivedio(data, "generate", "x", "--model", "nope", "--wait")
    assert bad_model.returncode == 2 and "unknown model" in bad_model.stderr  # a refused request is a usage error


@pytest.mark.timeout(900)
def test_fifty_generations_in_embedded_mode(tmp_path: Path) -> None:
    data = tmp_path / "data"
    sample_png(tmp_path / "ref.png")
    batch = tmp_path / "batch.jsonl"
    batch.write_text(
        "".join(
            json.dumps(
                {
                    "prompt": f"shot {i}",
                    "duration_s": 1,
                    "resolution": "360p",
                    **({"images": ["ref.png"]} if i % 10 == 0 else {}),
                }
            )
            + "\n"
            for i in range(TASKS)
        )
    )
    out = tmp_path / "results.jsonl"
    run = _aivedio(data, "batch", "run", str(batch), "--concurrency", "8", "--out", str(out), "--json", timeout=840)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["succeeded"] == TASKS and summary["failed"] == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == TASKS and len({r["id"] for r in lines}) == TASKS
    for line in lines:
        assert 0.5 < ffprobe_duration(Path(line["outputs"]["proxy_mp4"])) < 2
    for line in lines[:10]:
        assert 0.5 < ffprobe_duration(Path(line["outputs"]["hls"])) < 2

    rerun = _aivedio(data, "batch", "run", str(batch), "--json", timeout=120)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert json.loads(rerun.stdout)["resumed"] == TASKS
