"""`aivedio models list` shows each model's limits: durations, aspect ratios, how many references of what size."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from aivedio_cli.main import app

runner = CliRunner()
CONFIG = """
[providers.local]
adapter = "local"
[providers.local.models.local-v1]
max_duration_s = 10
resolutions = ["720p"]
price_per_second = { "720p" = "1" }

[providers.runway]
adapter = "runway"
[providers.runway.models.veo3]
max_duration_s = 8
resolutions = ["720p"]
price_per_second = { "720p" = "4" }
[providers.runway.models.gen4_aleph]
max_duration_s = 10
resolutions = ["720p"]
price_per_second = { "720p" = "2" }
"""


def test_models_list_shows_the_limits(tmp_path: Path) -> None:
    config = tmp_path / "aivedio.toml"
    config.write_text(CONFIG)
    base = ["--config", str(config), "--set", f"data_dir={tmp_path / 'data'}", "models", "list"]
    run = runner.invoke(app, [*base, "--json"])
    assert run.exit_code == 0, run.output
    models = {m["model"]: m for m in json.loads(run.output)["data"]}
    veo = models["veo3"]
    assert veo["aspect_ratios"] == ["16:9", "9:16"] and veo["limits"]["durations_s"] == [4, 6, 8]
    assert veo["default_duration_s"] == 4
    aleph = models["gen4_aleph"]["limits"]
    assert (aleph["max_reference_videos"], aleph["min_reference_videos"], aleph["max_video_bytes"]) == (1, 1, 32 << 20)
    table = runner.invoke(app, base)
    assert table.exit_code == 0, table.output
    rows = {line.split("│")[2].strip(): line for line in table.output.splitlines() if line.count("│") > 3}
    assert "4, 6, 8 (default 4)" in rows["veo3"] and "≤ 1 image (16 MB), no video" in rows["veo3"]
    assert "≤ 1 video (32 MB), video required" in rows["gen4_aleph"]
    assert "≤ 1 image (32 MB), no video" in rows["local-v1"]
