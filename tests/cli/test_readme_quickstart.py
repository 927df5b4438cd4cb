"""The README's first command, `bash scripts/quickstart`, run as written in a throwaway copy of the repository's
scripts and configuration: it must end with the task SUCCEEDED and print the four outputs, each an existing file.
The copy's `.venv` points at this interpreter and is marked installed, so nothing is installed into it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_quickstart_runs_one_generation_to_success(tmp_path: Path) -> None:
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg is not installed")
    root = tmp_path / "repo"
    for name in ["scripts/quickstart", "scripts/_setup.sh", "pyproject.toml", "aivedio.toml", "requirements/base.txt"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    venv_bin = root / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    for tool in ["python", "aivedio"]:
        (venv_bin / tool).symlink_to(Path(sys.executable).with_name(tool))
    (root / ".venv" / ".aivedio-installed").touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    res = subprocess.run(["bash", "scripts/quickstart"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "SUCCEEDED" in res.stdout + res.stderr
    outputs = dict(line.split(": ", 1) for line in res.stdout.splitlines() if ": /" in line)
    assert set(outputs) == {"hls", "proxy_mp4", "thumbnail", "waveform"}, res.stdout
    for name, path in outputs.items():
        assert Path(path).is_file() and Path(path).stat().st_size > 0, name
        assert Path(path).is_relative_to(root / ".aivedio"), path
