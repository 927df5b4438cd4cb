"""Who a media child runs as and what it can reach ("isolated, non-root; limit CPU, memory, temp
disk, process count and execution time; no network access it does not need").

`sandbox` applies these around every ffprobe/ffmpeg child; this module decides how, from the policy (settings
`media.sandbox`) and what this machine allows (`capabilities()`, probed once per process):

- **No network:** a fresh network namespace (`unshare --net`; `--user --map-root-user` first when not root) holds
  only a downed loopback, so even an input that talks ffmpeg into opening a URL reaches nothing.
- **A user of its own:** when the engine runs as root and the run names its job directory, the child runs as a
  uid from a small pool (`uid_base` … `uid_base + uid_count - 1`; numeric, no passwd entry needed) that no
  other live job holds — leases are `flock`s, so they hold across every engine process on the host. The job
  directory is handed to that uid for the run and taken back afterwards. One uid per job is what makes the
  process-count limit (RLIMIT_NPROC counts every process of a uid) a per-job limit, and no_new_privs keeps a
  setuid binary from raising it again. When the run ends, everything that uid still runs is killed: a child
  that forked away from its process group does not outlive its job.
- **Limits:** processes/threads (`max_processes`, pool mode only: for a shared uid the count would include the
  engine's own threads), the size of any file written (`max_file_bytes`, RLIMIT_FSIZE) and the job directory's
  total size (`max_disk_bytes`, a watchdog in `sandbox`).
Without root, setpriv or unshare the run still happens, with what is available; `aivedio doctor` says which.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aivedio_engine.config import SandboxSettings


@dataclass(frozen=True, slots=True)
class Policy:
    network_isolation: bool = True
    user_isolation: bool = True
    uid_base: int = 61_000
    uid_count: int = 32
    max_processes: int = 256
    max_file_bytes: int = 4 * 1024**3
    max_disk_bytes: int = 8 * 1024**3


@dataclass(frozen=True, slots=True)
class Capabilities:
    #: argv that puts the child in a network namespace of its own; [] when this machine cannot
    netns: tuple[str, ...]
    netns_note: str
    #: setpriv's path when children can be given a pool uid (running as root); None otherwise
    setpriv: str | None
    user_note: str
    prlimit: str | None


_policy = Policy()
log = logging.getLogger("aivedio.media.isolation")
#: how long a released uid's leftover processes get to die before the lease is dropped anyway
RELEASE_WAIT_S = 2.0


def policy_from(settings: SandboxSettings) -> Policy:
    return Policy(
        network_isolation=settings.network_isolation,
        user_isolation=settings.user_isolation,
        uid_base=settings.uid_base,
        uid_count=settings.uid_count,
        max_processes=settings.max_processes,
        max_file_bytes=settings.max_file_bytes,
        max_disk_bytes=settings.max_disk_bytes,
    )


def configure(policy: Policy) -> None:
    """Set this process's policy (bootstrap does, from the settings)."""
    global _policy
    _policy = policy


def policy() -> Policy:
    return _policy


@functools.cache
def capabilities() -> Capabilities:
    prlimit, setpriv, unshare = (shutil.which(n) for n in ("prlimit", "setpriv", "unshare"))
    netns: tuple[str, ...] = ()
    note = "unshare not installed (util-linux)"
    if unshare:
        note = "this kernel or container refuses new network namespaces"
        tries = ([unshare, "--net", "--"], [unshare, "--user", "--map-root-user", "--net", "--"])
        for argv in tries if os.geteuid() == 0 else tries[::-1]:
            if _runs([*argv, "true"]):
                netns, note = tuple(argv), "own network namespace (no interface up)"
                break
    if setpriv is None:
        user_note, pool = "setpriv not installed (util-linux): children run as the engine's user", None
    elif os.geteuid() != 0:
        user_note, pool = "the engine is not root: children run as its own user", None
    else:
        user_note, pool = "a uid of its own per job", setpriv
    return Capabilities(netns, note, pool, user_note, prlimit)


def report(policy: Policy) -> list[tuple[str, bool, str, str]]:
    """What `policy` amounts to on this machine, for `aivedio doctor`: (aspect, in force, detail, advice)."""
    caps = capabilities()
    network = (
        "network",
        bool(caps.netns) and policy.network_isolation,
        caps.netns_note if policy.network_isolation else "off (media.sandbox.network_isolation = false)",
        "allow network namespaces (unshare --net), or rely on ffmpeg's protocol whitelist alone",
    )
    pool = f"uids {policy.uid_base}..{policy.uid_base + policy.uid_count - 1}"
    closed = [
        path
        for name in ("ffmpeg", "ffprobe")
        if (path := shutil.which(name)) is not None
        and not (_reachable(Path(path).resolve()) and os.stat(path).st_mode & stat.S_IXOTH)
    ]
    user = (
        "user",
        caps.setpriv is not None and policy.user_isolation,
        f"{caps.user_note} ({pool}, at most {policy.max_processes} processes each)"
        if policy.user_isolation
        else "off (media.sandbox.user_isolation = false)",
        "run the engine as root (it drops to a pool uid per job), or accept a shared uid without a process limit",
    )
    if closed and user[1]:
        # a pool uid must be able to run the binaries: one under a private directory fails every media job
        user = (
            "user",
            False,
            f"{', '.join(closed)} cannot be run by a pool uid",
            "install ffmpeg where others may run it",
        )
    return [network, user]


def _runs(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


# --- uid leases ----------------------------------------------------------------------------------------------


class UidLease:
    """One pool uid, held (flock) until `release()`; the job directory is the uid's while it is held."""

    def __init__(self, uid: int, fd: int, workdir: Path) -> None:
        self.uid, self._fd, self.workdir = uid, fd, workdir
        _chown_tree(workdir, uid, uid)

    def wrap(self, setpriv: str) -> list[str]:
        limit = [p, f"--nproc={_policy.max_processes}", "--"] if (p := capabilities().prlimit) else []
        ids = [f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups"]
        # pdeathsig after the uid change (setpriv applies it last; a credential change would clear it)
        return [setpriv, *ids, "--no-new-privs", "--pdeathsig", "KILL", "--", *limit]

    def release(self, setpriv: str) -> None:
        try:
            # kill(-1) as the uid: every process it still has, wherever it moved to (setsid, double fork)
            # the shell's own kill: procps' kill(1) refuses the pid -1
            kill = [
                setpriv,
                f"--reuid={self.uid}",
                f"--regid={self.uid}",
                "--clear-groups",
                "--",
                "sh",
                "-c",
                "kill -9 -1",
            ]
            deadline = time.monotonic() + RELEASE_WAIT_S
            while uid_processes(self.uid):
                subprocess.run(kill, capture_output=True, timeout=10, check=False)
                if time.monotonic() > deadline:  # the uid goes back anyway; its next job may start short
                    log.warning("sandbox uid %d still has processes after the kill", self.uid)
                    break
                time.sleep(0.01)  # SIGKILL is delivered asynchronously: look again
            if self.workdir.exists():
                _chown_tree(self.workdir, os.geteuid(), os.getegid())
        finally:
            os.close(self._fd)  # closing the descriptor drops the flock


def lease_for(workdir: Path | None) -> UidLease | None:
    """A pool uid for a run in `workdir`, or None when the run stays as the engine's user: no workdir named, no
    root or setpriv, isolation off, or a workdir the uid could not reach (an ancestor closed to others)."""
    if workdir is None or not _policy.user_isolation or capabilities().setpriv is None:
        return None
    workdir = Path(workdir).resolve()
    if not _reachable(workdir):
        return None
    uids = [_policy.uid_base + i for i in range(_policy.uid_count)]
    locks = _lock_dir()
    start = (os.getpid() + threading.get_ident()) % len(uids)
    for uid in uids[start:] + uids[:start]:
        fd = os.open(locks / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return UidLease(uid, fd, workdir)
    # every uid is busy: wait for the one this thread would have tried first (its job ends, the lock drops)
    fd = os.open(locks / f"{uids[start]}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return UidLease(uids[start], fd, workdir)


@functools.cache
def _lock_dir() -> Path:
    path = Path(tempfile.gettempdir()) / f"aivedio-sandbox-{os.geteuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _reachable(workdir: Path) -> bool:
    # every ancestor must let others through (x), or the uid cannot even reach the directory it is given
    return all(os.stat(parent).st_mode & stat.S_IXOTH for parent in workdir.parents)


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid, follow_symlinks=False)
    for path in _tree(root):
        try:
            os.chown(path, uid, gid, follow_symlinks=False)
        except FileNotFoundError:
            continue


def _tree(root: Path) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            yield os.path.join(dirpath, name)


def uid_processes(uid: int) -> list[int]:
    """Live processes of `uid` (zombies excluded: they hold nothing but a pid until reaped)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state != b"Z":
            found.append(int(entry))
    return found


def tree_bytes(root: Path) -> int:
    """Bytes in the files under `root` (the temp-disk watchdog's measure)."""
    total = 0
    for path in _tree(root):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_blocks * 512  # what the disk holds (a sparse file holds little)
    return total


@contextmanager
def lease_scope(workdir: Path | None) -> Iterator[UidLease | None]:
    lease = lease_for(workdir)
    try:
        yield lease
    finally:
        if lease is not None:
            setpriv = capabilities().setpriv
            assert setpriv is not None
            lease.release(setpriv)
