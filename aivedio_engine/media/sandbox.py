"""The resource limits every ffmpeg/ffprobe child runs under (util-linux `prlimit`), in one place.

prlimit execs its command, so the pid stays ffmpeg's and a wall-clock kill reaches the right process. The CPU
limit is soft:hard with a one-second gap so the kernel sends SIGXCPU (a clear "CPU limit" reason) before the
SIGKILL of the hard limit, which would read like the OOM killer.
"""

from __future__ import annotations

import shutil
import signal

#: open files a media child may hold (inputs, outputs, its libraries)
NOFILE = 256


def prefix(cpu_s: int, address_space_bytes: int, prlimit: str | None = None) -> list[str]:
    """argv prefix applying the limits; [] when prlimit is not installed (the wall-clock timeout still holds)."""
    prlimit = prlimit or shutil.which("prlimit")
    if prlimit is None:
        return []
    cpu = max(1, int(cpu_s))
    return [prlimit, f"--as={address_space_bytes}", f"--cpu={cpu}:{cpu + 1}", f"--nofile={NOFILE}", "--"]


def signal_reason(returncode: int) -> str:
    """'killed by SIGKILL' for a child that a signal ended (a negative return code)."""
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"killed by {name}"


def encoder_cpu_s(timeout_s: float) -> int:
    """CPU seconds for an ffmpeg encode: they add up over encoder threads, so a multiple of the wall clock."""
    return max(2, int(timeout_s * 4) + 1)
