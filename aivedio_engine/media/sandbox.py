"""How every ffmpeg/ffprobe child runs, in one place: resource limits, its own session, and who ended it.

Limits (util-linux `prlimit`): prlimit execs its command, so the pid stays ffmpeg's and a wall-clock kill
reaches the right process. The CPU limit is soft:hard with a one-second gap so the kernel sends SIGXCPU (a clear
"CPU limit" reason) before the SIGKILL of the hard limit, which would read like the OOM killer.

Isolation (`isolation`): no network (its own network namespace), a uid of its own per job when the engine is
root and the run names its job directory (`workdir`), per-job process and file-size limits, and a watchdog on the
job directory's total size. When a child ends, whatever it left running in its group is killed too.

Session: each child starts in a new session (its own process group), so the Ctrl-C a terminal sends to the
command's group reaches the command, which decides, and never the encoder behind its back. `setpriv
--pdeathsig KILL`, when installed, makes a child that outlives the thread that started it (the command was
killed) die rather than run on as an orphan.

Who ended it: a child's exit status cannot say — ffmpeg traps SIGINT, SIGTERM and SIGXCPU alike and exits 255.
So `Child` records why *we* signal it (our wall-clock timeout; an interruption: shutdown, cancel) before the
signal is sent, and `Child.ending` answers from that record first. Only what we did not send is read from the
status: death by SIGINT/SIGTERM/SIGHUP is an interruption (retryable), any other signal a sandbox limit or a
crash (SIGXCPU, the hard CPU limit's or the OOM killer's SIGKILL, SIGSEGV on hostile input).

`stopping()` interrupts every live child of this process and refuses new ones while its block runs: the
embedded engine shuts down inside it, so media work in flight ends as "interrupted" and is retried later.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from aivedio_engine.media import isolation

#: open files a media child may hold (inputs, outputs, its libraries)
NOFILE = 256
#: signals that ask a process to stop (a terminal's Ctrl-C or hang-up, a service manager's stop): not a verdict
#: on the media, so a child they ended is retried
INTERRUPT_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
#: how often the temp-disk watchdog measures a job directory
DISK_CHECK_S = 0.25
#: after a timeout and the clean-up, how long the pipes may take to close before they are given up on
PIPE_GRACE_S = 5.0


class Ending(StrEnum):
    """Who ended a child."""

    #: it ended by itself; the return code says how (0, an error, or ffmpeg's 255 after a signal it trapped)
    EXITED = "exited"
    #: our wall-clock limit: we killed it (a rejection: the input costs too much)
    TIMEOUT = "timeout"
    #: a signal we did not send and that asks for no stop: a sandbox limit (SIGXCPU, SIGKILL) or a crash
    KILLED = "killed"
    #: we stopped it (shutdown, cancel) or SIGINT/SIGTERM/SIGHUP did: retryable, never a rejection
    INTERRUPTED = "interrupted"


class Interrupted(Exception):
    """No child was started: this process is stopping its sandboxed children (`stopping()`)."""


def prefix(cpu_s: int, address_space_bytes: int, prlimit: str | None = None) -> list[str]:
    """argv prefix applying the limits; [] when prlimit is not installed (the wall-clock timeout still holds).
    The namespace, the uid and the orphan guard are added by `spawn`, around it."""
    prlimit = prlimit or shutil.which("prlimit")
    if prlimit is None:
        return []
    cpu = max(1, int(cpu_s))
    fsize = isolation.policy().max_file_bytes
    return [
        prlimit,
        f"--as={address_space_bytes}",
        f"--cpu={cpu}:{cpu + 1}",
        f"--nofile={NOFILE}",
        f"--fsize={fsize}",
        "--",
    ]


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


# --- running ---------------------------------------------------------------------------------------------


class Child:
    """One sandboxed child process in its own session. Use `spawn()`; leave through `with` or `wait()`."""

    def __init__(
        self, proc: subprocess.Popen[bytes], lease: isolation.UidLease | None = None, workdir: Path | None = None
    ) -> None:
        self.proc = proc
        #: why we signalled it, recorded before the signal is sent
        self.stopped_by: Ending | None = None
        self.stop_signal: int | None = None
        #: the sandbox limit our watchdog enforced, in words ("temp disk over N bytes")
        self.limit: str | None = None
        self._lease = lease
        self._workdir = workdir
        self._done = threading.Event()
        self._cleaned = False
        if workdir is not None:
            threading.Thread(target=self._watch_disk, name=f"disk-watch-{proc.pid}", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def expire(self) -> None:
        """Our wall-clock limit ran out: kill it (classed TIMEOUT)."""
        self._signal(Ending.TIMEOUT, signal.SIGKILL)

    def interrupt(self, sig: int = signal.SIGKILL) -> None:
        """Stop it for a reason that is no verdict on its input (shutdown, cancel): classed INTERRUPTED.

        SIGKILL by default: on SIGINT/SIGTERM ffmpeg first finalises its output, work that is thrown away."""
        self._signal(Ending.INTERRUPTED, sig)

    def _signal(self, why: Ending, sig: int) -> None:
        with _lock:
            if self.proc.returncode is not None:
                return  # already reaped: its pid may belong to someone else by now
            if self.stopped_by is None:  # the first reason wins: a timeout stays a timeout
                self.stopped_by, self.stop_signal = why, sig
            try:
                os.killpg(self.proc.pid, sig)  # the whole group: its own session holds only it (and its children)
            except (ProcessLookupError, PermissionError):
                pass

    def wait(self, timeout: float | None = None) -> int:
        code = self.proc.wait(timeout)
        _forget(self)
        self.clean_up()
        return code

    def clean_up(self) -> None:
        """Kill what it left in its group and, with a pool uid, everything that uid runs; release the uid."""
        with _lock:
            if self._cleaned:
                return
            self._cleaned = True
        self._done.set()
        try:  # what it left behind in its group (a forked helper, a fork bomb's children)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self._lease is not None:
            setpriv = isolation.capabilities().setpriv
            assert setpriv is not None
            self._lease.release(setpriv)

    def _watch_disk(self) -> None:
        assert self._workdir is not None
        cap = isolation.policy().max_disk_bytes
        while not self._done.wait(DISK_CHECK_S):
            if isolation.tree_bytes(self._workdir) > cap:
                self.limit = f"temp disk over {cap} bytes"
                self._signal(Ending.KILLED, signal.SIGKILL)
                return

    def ending(self, returncode: int | None = None) -> Ending:
        """Who ended it, given its return code (default: the one it exited with)."""
        code = self.proc.returncode if returncode is None else returncode
        if code == 0:
            return Ending.EXITED  # it finished before our signal could matter
        if self.stopped_by is not None:
            return self.stopped_by
        if code is not None and code < 0:
            return Ending.INTERRUPTED if -code in INTERRUPT_SIGNALS else Ending.KILLED
        return Ending.EXITED

    def describe(self, returncode: int | None = None) -> str:
        """Why it ended, in words: 'timed out', 'interrupted by SIGINT', 'stopped (interrupted)', 'exit code 1'."""
        code = self.proc.returncode if returncode is None else returncode
        ending = self.ending(code)
        if ending is Ending.INTERRUPTED and self.stopped_by is None and code is not None and code < 0:
            return f"interrupted by {signal.Signals(-code).name}"
        if ending is Ending.INTERRUPTED:
            return "interrupted (this process is stopping it)"
        if ending is Ending.TIMEOUT:
            return "timed out"
        if self.limit is not None:
            return f"killed: {self.limit}"
        if code is not None and code < 0:
            return signal_reason(code)
        return f"exit code {code}"

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:  # left early (an exception in the caller): never leave it running
            self.interrupt()
        self.wait()


@dataclass(frozen=True, slots=True)
class Finished:
    returncode: int
    stdout: bytes
    stderr: bytes
    ending: Ending
    #: `Child.describe()` of the run
    reason: str


class _State:
    stopping = 0


_lock = threading.Lock()
_live: set[Child] = set()
_state = _State()


def spawn(argv: Sequence[str], *, workdir: Path | None = None, **popen: Any) -> Child:
    """Start `argv` (prefix included by the caller) in a new session, isolated (`isolation`); Interrupted while
    `stopping()` runs. `workdir`: the job directory holding every file the child reads and writes; with it the
    child may get a uid of its own and its temp disk is watched.

    Popen's own errors (FileNotFoundError for a missing binary) pass through."""
    popen.pop("start_new_session", None)
    caps, policy = isolation.capabilities(), isolation.policy()
    lease = isolation.lease_for(workdir)  # before the lock: it may wait for a uid to come free
    try:
        wrap = list(caps.netns) if policy.network_isolation else []
        if lease is not None and caps.setpriv is not None:
            wrap += lease.wrap(caps.setpriv)
        elif setpriv := shutil.which("setpriv"):
            # a child whose starting thread is gone (the command was killed outright) dies, not runs on
            wrap += [setpriv, "--no-new-privs", "--pdeathsig", "KILL", "--"]
        with _lock:  # under the lock: a child cannot slip past a `stopping()` that is snapshotting the live set
            if _state.stopping:
                raise Interrupted("this process is stopping its media children")
            proc = subprocess.Popen([*wrap, *argv], start_new_session=True, **popen)
            child = Child(proc, lease, workdir)
            _live.add(child)
    except BaseException:
        if lease is not None and caps.setpriv is not None:
            lease.release(caps.setpriv)
        raise
    return child


def run(
    argv: Sequence[str], *, timeout_s: float, env: dict[str, str], cwd: str | None = None, workdir: Path | None = None
) -> Finished:
    """Run `argv` to its end with stdout/stderr captured and a wall-clock limit (`Child.expire`)."""
    with spawn(
        argv,
        workdir=workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
    ) as child:
        try:
            out, err = child.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.expire()
            # its group is dead; a process it moved out of the group (setsid) may still hold the pipes open: the
            # clean-up (the pool uid's sweep) gets it, and whatever still holds them after that is not waited for
            child.clean_up()
            try:
                out, err = child.proc.communicate(timeout=PIPE_GRACE_S)
            except subprocess.TimeoutExpired:
                for pipe in (child.proc.stdout, child.proc.stderr):
                    if pipe is not None:
                        pipe.close()
                out, err = b"", b""
        code = child.wait()
    return Finished(code, out or b"", err or b"", child.ending(code), child.describe(code))


def _forget(child: Child) -> None:
    with _lock:
        _live.discard(child)


def live() -> int:
    """How many sandboxed children this process is running."""
    with _lock:
        return len(_live)


@contextmanager
def stopping(sig: int = signal.SIGKILL) -> Iterator[int]:
    """Interrupt every live child (INTERRUPTED: retried later, never a rejection) and refuse new ones until the
    block ends. Yields how many were interrupted. Process-wide: every engine in this process is affected."""
    with _lock:
        _state.stopping += 1
        children = list(_live)
    for child in children:
        child.interrupt(sig)
    try:
        yield len(children)
    finally:
        with _lock:
            _state.stopping -= 1
