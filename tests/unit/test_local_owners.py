"""Whether the process that holds a `local` job is gone (providers/local_owners.py), checked against real
processes: a takeover of a live renderer's job would render it twice at once."""

from __future__ import annotations

import os
import socket
import subprocess

from aivedio_engine.providers import local_owners as owners


def test_this_process_is_alive_and_a_closed_instance_of_it_is_not() -> None:
    owners.LIVE_TOKENS.add("t-live")
    try:
        assert not owners.orphaned(owners.owner_id("t-live"))
        assert owners.orphaned(owners.owner_id("t-closed"))  # an instance of this process that was closed
    finally:
        owners.LIVE_TOKENS.discard("t-live")


def test_a_dead_process_is_gone_a_live_one_is_not_and_a_reused_pid_is_told_apart() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        started = owners.started_at(proc.pid)
        owner = f"{socket.gethostname()}:{proc.pid}:{started}:tok"
        assert started not in ("", "?") and not owners.orphaned(owner)
        # the same pid with another start time: the process that held the job is gone, another has its pid
        assert owners.orphaned(f"{socket.gethostname()}:{proc.pid}:{int(started) - 1}:tok")
    finally:
        proc.kill()
        proc.wait()
    assert owners.started_at(proc.pid) == "" and owners.orphaned(owner)


def test_a_process_on_another_machine_is_never_presumed_dead_and_garbage_is() -> None:
    assert not owners.orphaned(f"elsewhere.example:{os.getpid() + 1}::tok")
    assert owners.orphaned("not an owner id")
