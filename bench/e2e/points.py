"""Measured points: a number of tasks sent open loop (at a rate) or closed loop (a fixed number in flight), each
followed to its terminal state, with the CPU each process group used and the hops its messages took; and the
saturation search (closed loop at growing concurrency, the highest completion rate)."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import common
from bench.common import CpuSampler
from bench.e2e import analysis
from bench.e2e.client import TaskRun, drive_closed, drive_open
from bench.e2e.system import System

#: process groups whose CPU is reported per task (the worker's ffprobe/ffmpeg children are counted apart)
PROCESS_GROUPS = ("api", "scheduler", "relay", "worker", "media_children", "sim", "moto", "postgres", "redis")


def cpu_groups(system: System) -> dict[str, Callable[[int, str, str], bool]]:
    pids = {name: p.pid for name, p in system.procs.items()}
    me = os.getpid()
    groups: dict[str, Callable[[int, str, str], bool]] = {"client": lambda pid, comm, cmd: pid == me}
    for name in ("api", "scheduler", "relay", "worker", "sim", "moto"):
        groups[name] = lambda pid, comm, cmd, want=pids[name]: pid == want
    groups["redis"] = lambda pid, comm, cmd: comm == "redis-server"
    groups.update(common.postgres_groups([system.db]))
    return groups


def children_cpu_s(pid: int) -> float:
    """CPU seconds of the waited-for children of `pid` (cutime + cstime): the worker's ffprobe/ffmpeg runs."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return math.nan


class CpuWindow:
    """Cores used by each group over [start + skip, start + skip + length] (the steady middle of a point), with
    the window's wall-clock bounds so the completions inside it can be counted."""

    def __init__(self, system: System, skip_s: float, length_s: float) -> None:
        self.system, self.skip_s, self.length_s = system, skip_s, length_s
        self.result: dict[str, float] = {}
        self.bounds = (math.nan, math.nan)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stop = threading.Event()

    def start(self) -> None:
        if self.length_s >= 3:
            self._thread.start()

    def _run(self) -> None:
        if self._stop.wait(self.skip_s):
            return
        sampler = CpuSampler(cpu_groups(self.system))
        sampler.start()
        worker = self.system.procs["worker"].pid
        kids0, t0, w0 = children_cpu_s(worker), time.monotonic(), time.time()
        self._stop.wait(self.length_s)
        res = sampler.stop()
        kids = (children_cpu_s(worker) - kids0) / max(1e-9, time.monotonic() - t0)
        if res and math.isfinite(kids):
            res["media_children_cores"] = round(kids, 3)
            res["other_cores"] = round(res["other_cores"] - kids, 3)
        self.bounds = (w0, time.time())
        self.result = res

    def join(self, runs: list[TaskRun]) -> dict[str, Any]:
        """The cores by group, the completions/s inside the window and the CPU seconds per task by group."""
        if self._thread.is_alive():
            self._thread.join()
        if not self.result:
            return {}
        lo, hi = self.bounds
        done = sum(1 for r in runs if r.terminal == "SUCCEEDED" and lo <= r.t_terminal <= hi)
        rate = done / (hi - lo) if hi > lo else math.nan
        per_task = {
            g: self.result[f"{g}_cores"] / rate for g in PROCESS_GROUPS if f"{g}_cores" in self.result and rate > 0
        }
        if per_task:
            per_task["total"] = sum(per_task.values())
        return {**self.result, "completions_in_window": done, "window_rate": rate, "cpu_s_per_task": per_task}


def run_point(
    system: System,
    label: str,
    cfg: argparse.Namespace,
    *,
    rate: float = math.nan,
    n: int,
    concurrency: int | None = None,
    stop_after_s: float | None = None,
    gap_s: float = 0.0,
    cpu_window: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """Send `n` tasks open loop at `rate`/s, or closed loop with `concurrency` in flight (until `stop_after_s`),
    follow each to its terminal state, then measure: overheads, stages, hops, CPU in `cpu_window` (skip, length)."""
    system.check()
    tag = f"{label}-{secrets.token_hex(4)}"
    runs = [TaskRun(i, i / rate if concurrency is None else 0.0, f"{tag}-{i}") for i in range(n)]
    window = CpuWindow(system, *cpu_window) if cpu_window else None
    if window:
        window.start()
    t0 = time.time()
    obs = (cfg.observe, cfg.get_interval_ms / 1000, cfg.point_timeout)
    if concurrency is None:
        info = asyncio.run(drive_open(system.api_url, system.api_key, runs, *obs, cfg.max_backlog))
    else:
        info = asyncio.run(drive_closed(system.api_url, system.api_key, runs, *obs, concurrency, gap_s, stop_after_s))
    elapsed = time.time() - t0
    cpu = window.join(runs) if window else {}
    if info.get("stopped_at_backlog"):
        cpu = {}  # the window outlived the sending: not a steady state
    system.check()
    ok_ids = [r.task_id for r in runs if r.terminal == "SUCCEEDED" and r.task_id]
    extras = analysis.db_extras(system.db_url, ok_ids)
    point = analysis.analyse_point(
        label, rate, runs, elapsed, extras, system.sim_truth().get("jobs", []), cfg.job_seconds, info
    )
    lines = system.hops_path.read_text().splitlines() if system.hops_path.exists() else []
    point["hops"] = analysis.hop_summary(analysis.hop_rows(system.db_url, lines, t0 * 1000, time.time() * 1000))
    point["cpu"] = cpu
    if concurrency is not None and stop_after_s:
        # closed loop: completions/s over the middle 80 % of finishes, or inside the CPU window when sampled
        point["saturation_rate"] = cpu.get("window_rate") or point["completion_rate"]
    return point


def measure_saturation(system: System, cfg: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    """Closed loop at each --concurrency for --saturation-seconds; saturation = the highest completion rate."""
    points = []
    for c in cfg.concurrency:
        secs = cfg.saturation_seconds
        skip = min(4.0, secs / 4)
        p = run_point(
            system,
            f"saturation-c{c}",
            cfg,
            n=max(4 * c, int(secs * 60)),
            concurrency=c,
            stop_after_s=secs,
            cpu_window=(skip, secs - skip - 1),
        )
        points.append(p)
        log(f"saturation c={c}: {p['succeeded']} tasks, {p.get('saturation_rate', math.nan):.2f} tasks/s")
    best = max(points, key=lambda p: p.get("saturation_rate") or 0.0)
    return {"rate": best.get("saturation_rate"), "concurrency": best["concurrency"], "points": points}
