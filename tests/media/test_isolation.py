"""The media sandbox's isolation, tried with real escapes: a network fetch through a crafted
playlist, a fork bomb, a disk filler (one big file, many small ones) and a setuid binary. Each ends as a clean
rejection, leaves nothing running, and the next run works. The uid cases need root (CI runs as root here); the
network case needs a kernel that allows network namespaces. Each says why when it cannot run."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from aivedio_engine.media import derive, isolation, sandbox
from aivedio_engine.media.probe import MediaLimits, ProbeError, probe_file

CAPS = isolation.capabilities()
needs_root = pytest.mark.skipif(CAPS.setpriv is None, reason=f"no per-job uid here: {CAPS.user_note}")
needs_netns = pytest.mark.skipif(not CAPS.netns, reason=f"no network namespace here: {CAPS.netns_note}")
#: the system's python: a venv's interpreter may sit under a directory a pool uid cannot enter
PYTHON = "/usr/bin/python3"
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}


@pytest.fixture
def jobdir() -> Iterator[Path]:
    """A job directory where the engine makes them (the system temp dir), so a pool uid can reach it."""
    with derive.job_dir() as path:
        yield path


@pytest.fixture(autouse=True)
def policy() -> Iterator[None]:
    """Each test starts from the default policy: it is process-wide, and any context built earlier in this process
    (another test's settings) may have changed it."""
    before = isolation.policy()
    isolation.configure(isolation.Policy())
    yield
    isolation.configure(before)


class _Listener:
    """A TCP listener on loopback that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


@needs_netns
def test_a_playlist_that_points_at_the_network_reaches_nothing(jobdir: Path, policy: None) -> None:
    listener = _Listener()
    playlist = jobdir / "evil.m3u8"
    seg = f"http://127.0.0.1:{listener.port}/seg0.ts"
    playlist.write_text(f"#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXTINF:2,\n{seg}\n#EXT-X-ENDLIST\n")
    # the whitelist that normally stops this is opened on purpose: the namespace alone must hold
    argv = ["ffprobe", "-v", "error", "-protocol_whitelist", "file,http,tcp,crypto", "-i", f"file:{playlist}"]
    done = sandbox.run(sandbox.prefix(20, 2**30) + argv, timeout_s=20, env=ENV, workdir=jobdir)
    assert done.returncode != 0 and listener.accepted == 0
    # the control: without the namespace the same run does connect (so the assertion above can fail)
    isolation.configure(isolation.Policy(network_isolation=False))
    sandbox.run(sandbox.prefix(20, 2**30) + argv, timeout_s=20, env=ENV, workdir=jobdir)
    assert listener.accepted >= 1
    # and through the engine's own gate the file is a clean rejection (hls is not an accepted format)
    with pytest.raises(ProbeError):
        probe_file(playlist, "video", MediaLimits(timeout_s=20, workdir=jobdir))


@needs_root
@pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK), reason="no system python3 for the bomb")
def test_a_fork_bomb_stops_at_the_jobs_process_limit_and_leaves_nothing_behind(jobdir: Path, policy: None) -> None:
    isolation.configure(isolation.Policy(max_processes=32))
    bomb = (
        "import os, time\n"
        "n = 0\n"
        "while n < 10000:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        os.setsid()\n"  # a child that leaves the group: only the uid sweep finds it
        "        os.close(1); os.close(2)\n"  # the run ends with the parent (pipes held open: see the timeout test)
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print(os.getuid(), n, flush=True)\n"
    )
    done = sandbox.run(sandbox.prefix(20, 2**31) + [PYTHON, "-c", bomb], timeout_s=30, env=ENV, workdir=jobdir)
    uid, forked = (int(x) for x in done.stdout.split())
    assert done.returncode == 0 and uid != os.geteuid()
    assert 0 < forked < 32  # the limit held (the interpreter itself counts too)
    assert isolation.uid_processes(uid) == []  # the sweep of the uid got the ones that escaped the group
    again = sandbox.run(["id", "-u"], timeout_s=10, env=ENV, workdir=jobdir)
    assert again.returncode == 0  # the engine and the pool are fine


@needs_root
@pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK), reason="no system python3 for the bomb")
def test_a_fork_bomb_through_the_media_runner_is_a_clean_rejection(jobdir: Path, policy: None) -> None:
    """What the engine sees when a (compromised) encoder forks without end: the fork is refused at the job's
    limit (EAGAIN or ENOMEM), the run fails, and the media step gets a permanent "resource limit" MediaError it
    records as a rejection; nothing of the uid is left running and the next job runs."""
    isolation.configure(isolation.Policy(max_processes=16))
    bomb = (
        "import os, sys, time\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            os.close(1); os.close(2); time.sleep(60); os._exit(0)\n"  # pipes held: the timeout test's case
        "    except OSError as exc:\n"
        "        sys.exit(f'fork refused: {exc}')\n"
    )
    with pytest.raises(derive.MediaError) as info:
        derive.run_ffmpeg([PYTHON, "-c", bomb], MediaLimits(timeout_s=30, workdir=jobdir))
    assert not info.value.retryable and "(resource limit)" in info.value.message, info.value.message
    pool = isolation.policy()
    left = [p for uid in range(pool.uid_base, pool.uid_base + pool.uid_count) for p in isolation.uid_processes(uid)]
    assert left == []  # every sleeper of the bomb was swept with its uid
    again = sandbox.run(["id", "-u"], timeout_s=10, env=ENV, workdir=jobdir)
    assert again.returncode == 0


def test_a_file_over_the_size_limit_ends_the_run_as_a_limit_rejection(jobdir: Path, policy: None) -> None:
    isolation.configure(isolation.Policy(max_file_bytes=1024**2))
    fill = ["sh", "-c", f"exec cat /dev/zero > {jobdir}/big"]  # exec: the signal reaches the child itself
    with pytest.raises(derive.MediaError) as info:
        derive.run_ffmpeg(fill, MediaLimits(timeout_s=20, workdir=jobdir))
    assert not info.value.retryable and info.value.message == "ffmpeg killed by SIGXFSZ (resource limit)"
    assert (jobdir / "big").stat().st_size == 1024**2


def test_many_small_files_over_the_job_disk_limit_are_stopped_by_the_watchdog(jobdir: Path, policy: None) -> None:
    isolation.configure(isolation.Policy(max_file_bytes=1024**2, max_disk_bytes=4 * 1024**2))
    fill = ["sh", "-c", f"i=0; while :; do head -c 500000 /dev/zero > {jobdir}/f$i; i=$((i+1)); done"]
    with pytest.raises(derive.MediaError) as info:
        derive.run_ffmpeg(fill, MediaLimits(timeout_s=30, workdir=jobdir))
    assert not info.value.retryable
    assert info.value.message == f"ffmpeg killed: temp disk over {4 * 1024**2} bytes (resource limit)"
    assert isolation.tree_bytes(jobdir) < 1024**3  # stopped within a watchdog period of the limit, not a full disk


@needs_root
def test_a_setuid_binary_gives_the_job_no_privileges(jobdir: Path) -> None:
    holder = Path(tempfile.mkdtemp(prefix="aivedio-suid-"))
    try:
        holder.chmod(0o755)
        suid = holder / "id"
        shutil.copy("/usr/bin/id", suid)
        os.chown(suid, 0, 0)
        suid.chmod(0o4755)
        assert suid.stat().st_mode & stat.S_ISUID
        done = sandbox.run([str(suid)], timeout_s=10, env=ENV, workdir=jobdir)
        assert done.returncode == 0 and b"euid=0" not in done.stdout and b"uid=0(" not in done.stdout
        # the control: the same uid without no_new_privs does become root through it
        assert CAPS.setpriv is not None
        plain = subprocess.run(
            [CAPS.setpriv, "--reuid=61999", "--regid=61999", "--clear-groups", "--", str(suid)],
            capture_output=True,
            timeout=10,
            check=False,
        )
        assert b"euid=0" in plain.stdout
    finally:
        shutil.rmtree(holder)


@needs_root
def test_the_job_directory_is_the_jobs_for_the_run_and_the_engines_again_after(jobdir: Path) -> None:
    (jobdir / "input").write_bytes(b"x")
    done = sandbox.run(
        ["sh", "-c", f"stat -c %u {jobdir}/input; id -u; touch {jobdir}/made"], timeout_s=10, env=ENV, workdir=jobdir
    )
    owner, uid = done.stdout.split()
    assert done.returncode == 0 and owner == uid and int(uid) != os.geteuid()
    assert {p.stat().st_uid for p in (jobdir, jobdir / "input", jobdir / "made")} == {os.geteuid()}
    # a directory a pool uid cannot reach (a parent closed to others) keeps the run as the engine's user
    closed = Path(tempfile.mkdtemp(prefix="aivedio-closed-"))
    try:
        (closed / "job").mkdir()
        assert isolation.lease_for(closed / "job") is None
    finally:
        shutil.rmtree(closed)


@needs_root
def test_a_process_that_leaves_its_group_and_holds_the_pipes_cannot_stall_the_run(jobdir: Path) -> None:
    # the parent exits at once; its child escapes the group (setsid) and keeps stdout open: only the wall-clock
    # timeout ends the run, and the uid sweep then lets the pipes close
    escape = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(120)\nprint(os.getuid())\n"
    done = sandbox.run([PYTHON, "-c", escape], timeout_s=2, env=ENV, workdir=jobdir)
    # the run came back (not after the child's 120 s) with what the parent wrote; the parent itself succeeded
    assert done.returncode == 0 and int(done.stdout) != os.geteuid()
    assert isolation.uid_processes(int(done.stdout)) == []
