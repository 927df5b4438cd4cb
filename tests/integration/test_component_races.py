"""Components are built once per process even when worker threads ask for them at the same moment: a second
local provider would own half of the jobs, and their polls would answer "not found" forever."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aivedio_engine.bootstrap import AppContext, build_context
from aivedio_engine.config import load_settings


@pytest.mark.parametrize(
    "grab",
    [
        pytest.param(lambda ctx: ctx.providers["local"], id="local provider"),
        pytest.param(lambda ctx: ctx.providers, id="provider registry"),
        pytest.param(lambda ctx: ctx.storage, id="object store"),
    ],
)
def test_threads_racing_for_a_component_get_one_instance(tmp_path: Path, grab: Callable[[AppContext], Any]) -> None:
    ctx = build_context(load_settings(None, {"data_dir": str(tmp_path)}))
    start = threading.Barrier(8)
    seen: list[object] = []

    def run() -> None:
        start.wait()
        seen.append(grab(ctx))

    threads = [threading.Thread(target=run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert len(seen) == 8 and len({id(p) for p in seen}) == 1
    finally:
        ctx.close()
