"""A request for n outputs, as a user makes it (issue 10 item 8): `aivedio generate --n 3 --wait` in embedded mode.

Every output is fetched, processed and exposed: the task SUCCEEDS only with three variants, each with its own
proxy MP4, HLS playlist and thumbnail; the variants are different videos (their middle frames differ); the
reservation is price x seconds x n; `generations download` writes each variant to v<i>/ with verified checksums.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.db.tables import credit_ledger
from tests.e2e.test_reference_pixels import frame_at


def _cli(data: Path, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIVEDIO_")}
    run = subprocess.run(
        [sys.executable, "-m", "aivedio_cli", "--set", f"data_dir={data}", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=data.parent,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    doc: dict[str, Any] = json.loads(run.stdout)
    return doc


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    data = tmp_path_factory.mktemp("multi") / "data"
    doc = _cli(data, "generate", "three takes of a lighthouse", "--n", "3", "--duration", "2", "--wait")
    return data, doc


def test_three_variants_each_with_its_derivatives(made: tuple[Path, dict[str, Any]]) -> None:
    _, doc = made
    assert doc["status"] == "SUCCEEDED"
    variants = doc["variants"]
    assert [v["index"] for v in variants] == [0, 1, 2]
    for v in variants:
        assert {"proxy_mp4", "hls", "thumbnail"} <= set(v["outputs"]), v
        for path in v["outputs"].values():
            assert Path(path).is_file()
    assert variants[0]["outputs"] == doc["outputs"]  # `outputs` stays the first
    proxies = {v["outputs"]["proxy_mp4"] for v in variants}
    assert len(proxies) == 3


def test_the_variants_are_different_videos(made: tuple[Path, dict[str, Any]]) -> None:
    _, doc = made
    frames = [frame_at(Path(v["outputs"]["proxy_mp4"]), 1.0) for v in doc["variants"]]
    for i in range(3):
        for j in range(i + 1, 3):
            a, b = frames[i], frames[j]
            changed = sum(1 for x, y in zip(a, b, strict=True) if abs(x - y) > 24) / len(a)
            assert changed > 0.05, f"variants {i} and {j}: only {changed:.2%} of the samples differ"


def test_the_reservation_is_price_times_seconds_times_n(made: tuple[Path, dict[str, Any]]) -> None:
    data, doc = made
    engine = sa.create_engine(f"sqlite:///{data / 'aivedio.db'}")
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(credit_ledger.c.entry_type, credit_ledger.c.amount).where(
                credit_ledger.c.task_id == uuid.UUID(doc["id"])
            )
        ).all()
    engine.dispose()
    # 360p: 0.5 credits/s x 2 s x 3 outputs; the local provider bills all three
    amounts = {r.entry_type: float(r.amount) for r in rows}
    assert amounts["RESERVE"] == -3.0, amounts
    assert amounts.get("SETTLE", 0.0) == 0.0, amounts


def test_generations_get_and_download_follow(made: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    data, doc = made
    got = _cli(data, "generations", "get", doc["id"])
    assert [v["index"] for v in got["variants"]] == [0, 1, 2]
    out = tmp_path / "out"
    result = _cli(data, "generations", "download", doc["id"], "--out", str(out))
    assert result["ok"], result
    for i in range(3):
        folder = out / f"v{i}"
        assert (folder / "proxy.mp4").is_file() and (folder / "hls" / "index.m3u8").is_file(), sorted(
            p.name for p in folder.iterdir()
        )
        assert any(p.name.startswith("original") for p in folder.iterdir())
    assert all(f["verified"] for f in result["files"] if f["profile"] != "hls" or f["path"].endswith(".m3u8"))
