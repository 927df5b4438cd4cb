"""Who renders a `local` job: the owner id a provider instance writes into `local_jobs.owner`, and whether the
instance an owner id names is gone, so that its unfinished jobs may be taken over (providers/local.py).

An owner id is "host:pid:start:token": the process's start time tells a reused pid from the process that had
it, and the token tells provider instances of one process apart. A process elsewhere is never presumed dead:
the local provider is one machine's (its output URLs are loopback).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

#: owners alive in this process, by instance token (several providers may share a process: tests, tools)
LIVE_TOKENS: set[str] = set()


def started_at(pid: int) -> str:
    """When process `pid` started (clock ticks since boot), so a reused pid is not taken for the process that
    had it; "" when it is gone, "?" when this system cannot tell (alive, start unknown)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return "" if fields[0] in ("Z", "X") else fields[19]
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return ""
    except OSError:
        pass
    return "?"


def owner_id(token: str) -> str:
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{started_at(pid)}:{token}"


def orphaned(owner: str) -> bool:
    """Whether the provider instance `owner` (an `owner_id`) is gone, so its unfinished jobs may be taken over."""
    try:
        host, pid, started, token = owner.rsplit(":", 3)
        if host != socket.gethostname():
            return False  # its liveness cannot be seen from here (local jobs are one machine's: loopback URLs)
        if int(pid) == os.getpid():
            return token not in LIVE_TOKENS
        now_started = started_at(int(pid))
        return now_started == "" or now_started != started  # gone, or its pid now names another process
    except ValueError:
        return True  # not an owner this code wrote
