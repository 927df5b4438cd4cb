"""`aivedio projects run photo_story` end to end in embedded mode, as a user runs the example: a real MP4 comes out.

The command runs in a fresh folder holding only the example's photo and a two-sentence script (two shots of 1 s),
exactly like `examples/photo_story/README.md` says, and the file it prints is probed: H.264 + AAC + a subtitle
track, the planned length, a loudness a person can listen to, a narration a speech recogniser hears as the
script; the SRT is timed from the narration; each clip's generation task reserved once and settled once.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "photo_story"

pytestmark = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg")


def _probe(path: Path) -> dict:
    out = subprocess.run(
        [
            "ffprobe",
            "-v",
            "error",
            "-show_entries",
            "format=duration:stream=codec_type,codec_name",
            "-of",
            "json",
            str(path),
        ],
        capture_output=True,
        check=True,
    )
    return json.loads(out.stdout)


def _loudness(path: Path) -> float:
    err = subprocess.run(
        ["ffmpeg", "-hide_banner", "-nostats", "-i", str(path), "-map", "0:a", "-af", "ebur128", "-f", "null", "-"],
        capture_output=True,
        check=True,
    ).stderr.decode()
    m = re.search(r"I:\s+(-?[0-9.]+) LUFS", err[err.rfind("Summary:") :])
    assert m, err[-500:]
    return float(m.group(1))


def _heard(video: Path, tmp_path: Path) -> None:
    """The narration is speech a recogniser understands (the example's `check_narration.py`, PocketSphinx): the
    script's words are heard, and a script that was not spoken is not. Two one-second lines under a music bed
    (seeded per project, so it differs between runs) are hard listening: "hello there" was heard in all 8 runs
    tried, "good bye" in 2 of 5 (else "that night", "the night"), hence half the words, not all."""

    def check(script: str) -> tuple[int, dict]:
        (tmp_path / "said.txt").write_text(script)
        proc = subprocess.run(
            [sys.executable, str(EXAMPLE / "check_narration.py"), str(video), str(tmp_path / "said.txt"), "--json"]
            + ["--min-overlap", "0.5"],
            capture_output=True,
            timeout=120,
        )
        assert proc.returncode in (0, 1), proc.stderr.decode()[-1000:]
        return proc.returncode, json.loads(proc.stdout)

    rc, said = check("Hello there. Good bye.")
    assert rc == 0 and said["heard"].startswith("hello there"), said
    rc, other = check("The boats went out before sunrise.")
    assert rc == 1 and other["overlap"] < 0.5, other


def test_example_command_makes_a_watchable_mp4(tmp_path: Path) -> None:
    readme = (EXAMPLE / "README.md").read_text()
    command = next(line for line in readme.splitlines() if line.startswith("aivedio projects run"))
    assert "photo=photo.png" in command and "script=@script.txt" in command
    shutil.copy(EXAMPLE / "photo.png", tmp_path / "photo.png")
    (tmp_path / "script.txt").write_text("Hello there. Good bye.\n")

    argv = [sys.executable, "-m", "aivedio_cli", *command.split()[1:], "--json"]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, timeout=240)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["status"] == "succeeded"
    steps = {s["key"]: s for s in doc["steps"]}
    assert all(s["status"] == "success" for s in steps.values()), steps
    assert {"clip[0]", "clip[1]", "composition", "final_qc", "delivery"} <= set(steps)
    assert doc["result_asset_id"]

    out = Path(doc["result"])
    assert out.is_file() and out.is_relative_to(tmp_path)
    probe = _probe(out)
    kinds = {s["codec_type"]: s["codec_name"] for s in probe["streams"]}
    assert kinds == {"video": "h264", "audio": "aac", "subtitle": "mov_text"}
    # two one-second shots
    assert abs(float(probe["format"]["duration"]) - 2.0) <= 0.1
    assert -24 <= _loudness(out) <= -10

    _heard(out, tmp_path)

    srt = next((tmp_path / ".aivedio" / "objects" / "workflows").glob("*/subtitles/subs.srt")).read_text()
    cues = re.findall(r"(\d\d:\d\d:\d\d,\d{3}) --> (\d\d:\d\d:\d\d,\d{3})\n(.+)", srt)
    assert [c[2] for c in cues] == ["Hello there.", "Good bye."]
    assert cues[0][0] == "00:00:00,000" and cues[1][0] == "00:00:01,000"

    # each clip ran as its own generation task: one reservation, one settlement, nothing charged twice
    db = sqlite3.connect(tmp_path / ".aivedio" / "aivedio.db")
    task_ids = [steps[f"clip[{i}]"]["generation_task_id"] for i in range(2)]
    assert all(task_ids) and len(set(task_ids)) == 2
    for task_id in task_ids:
        entries = [
            r[0]
            for r in db.execute("SELECT entry_type FROM credit_ledger WHERE task_id = ?", (task_id.replace("-", ""),))
        ] or [r[0] for r in db.execute("SELECT entry_type FROM credit_ledger WHERE task_id = ?", (task_id,))]
        assert entries.count("RESERVE") == 1, entries
        assert entries.count("SETTLE") + entries.count("RELEASE") == 1, entries
    # the project's actual cost is the sum of its steps' (the two clips; local steps are free)
    step_costs = sum(Decimal(s["cost_actual"]) for s in steps.values())
    assert step_costs == sum(Decimal(steps[f"clip[{i}]"]["cost_actual"]) for i in range(2)) > 0
    assert Decimal(doc["cost_actual"]) == step_costs
    # estimated up front from the script (two one-second shots × the local model's 0.5 credits/s): exactly what
    # the steps then cost
    assert Decimal(doc["cost_estimate"]) == step_costs == Decimal("1")
    # and the books and the store of the run hold every invariant, the delivery's key under workflows/{project}/
    # included (I8.3 had flagged it as outside the tenant's prefix)
    audit = subprocess.run(
        [sys.executable, "-m", "aivedio_cli", "audit", "--json"], cwd=tmp_path, capture_output=True, timeout=120
    )
    report = json.loads(audit.stdout)
    assert audit.returncode == 0 and report["ok"], [c for c in report["checks"] if c["violations"]]
