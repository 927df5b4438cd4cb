"""`aivedio serve --processes N`: N worker processes from one command, because one process's worker threads share
a GIL (measured: a reducer process saturates at 0.86–0.89 cores). The command's own process runs every role it
was given; N − 1 children run the worker role only, with the same configuration and queues. The parent watches
them: a child that dies is started again (at most once a second), and at shutdown every child gets SIGTERM, so
it finishes and requeues what it holds (`worker.runtime`), and is killed only if it does not end in time.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 40.0  # above the worker's own 30 s shutdown budget
RESTART_EVERY_S = 1.0


def child_argv(config_path: str | None, set_items: Sequence[str], queues: str | None) -> list[str]:
    argv = [sys.executable, "-m", "aivedio_cli"]
    if config_path:
        argv += ["--config", config_path]
    for item in set_items:
        argv += ["--set", item]
    argv += ["serve", "--role", "worker"]
    if queues:
        argv += ["--queues", queues]
    return argv


class WorkerChildren:
    def __init__(self, argv: list[str], count: int) -> None:
        self._argv = argv
        self._children: list[subprocess.Popen[bytes]] = []
        self._count = count
        self._last_start = 0.0
        self.restarts = 0

    def start(self) -> None:
        while len(self._children) < self._count:
            self._children.append(subprocess.Popen(self._argv, stdin=subprocess.DEVNULL))
        self._last_start = time.monotonic()

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self._children]

    def watch(self) -> None:
        """Replace children that died (called from the parent's main loop)."""
        dead = [c for c in self._children if c.poll() is not None]
        if not dead or time.monotonic() - self._last_start < RESTART_EVERY_S:
            return
        for child in dead:
            log.warning("worker process %d exited with %s; starting another", child.pid, child.returncode)
            self._children.remove(child)
            self.restarts += 1
        self.start()

    def stop(self) -> int:
        """SIGTERM every child, wait, kill the ones that do not end; returns how many did not end cleanly."""
        for child in self._children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        unclean = 0
        for child in self._children:
            try:
                code = child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                code = child.wait()
            # -SIGTERM: it was still starting (no handler yet), so it held no work
            unclean += code not in (0, -signal.SIGTERM)
        return unclean
