"""Components are built once per process even when worker threads ask for them at the same moment: a second
local provider would own half of the jobs, and their polls would answer "not found" forever."""

from __future__ import annotations

import threading
from pathlib import Path

from aivedio_engine.bootstrap import build_context
from aivedio_engine.config import load_settings


def test_threads_racing_for_a_provider_get_one_instance(tmp_path: Path) -> None:
    ctx = build_context(load_settings(None, {"data_dir": str(tmp_path)}))
    start = threading.Barrier(8)
    seen: list[object] = []

    def grab() -> None:
        start.wait()
        seen.append(ctx.providers["local"])

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert len(seen) == 8 and len({id(p) for p in seen}) == 1
    finally:
        ctx.close()


def test_threads_racing_for_the_context_get_one_registry(tmp_path: Path) -> None:
    ctx = build_context(load_settings(None, {"data_dir": str(tmp_path)}))
    start = threading.Barrier(8)
    seen: list[object] = []

    def grab() -> None:
        start.wait()
        seen.append(ctx.providers)

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert len({id(p) for p in seen}) == 1
    finally:
        ctx.close()
