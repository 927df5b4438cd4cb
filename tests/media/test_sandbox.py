"""Who ended a sandboxed child (media.sandbox): an interruption is retryable, only the sandbox's own limits reject.

Real processes throughout: small shell scripts stand in for ffmpeg/ffprobe, run through the same
`run_ffmpeg` / `run_ffprobe` as the real binaries (prlimit prefix included), so exit statuses and signals are
the kernel's. ffmpeg's own habit — trap SIGINT/SIGTERM/SIGXCPU and exit 255 — is imitated with `trap`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aivedio_engine.media import derive, isolation, sandbox
from aivedio_engine.media.probe import MediaLimits, ProbeError, ProbeInterrupted, ProbeUnavailable, run_ffprobe

LIMITS = MediaLimits(timeout_s=20)

#: a long-running child that traps the stop signals like ffmpeg does and exits 255 on them; `<script>.ready`
#: appears once the trap is set
TRAPS_LIKE_FFMPEG = """sleep 30 & pid=$!
trap 'kill $pid; exit 255' INT TERM HUP XCPU
touch "$0.ready"
wait $pid
"""


def _trapping(path: Path) -> Path:
    """Wait until the trapping fake at `path` has set its trap."""
    _until(Path(f"{path}.ready").exists, "the trap to be set")
    return path


def _until(check: Callable[[], bool], what: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def fake(tmp_path: Path) -> Callable[[str], Path]:
    def make(body: str, name: str = "fake-ffmpeg") -> Path:
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
        return path

    return make


class Background:
    """Run `call` on a thread; `result()` is its value or the exception it raised."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._out: list[Any] = []
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self._out.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self._out.append(exc)

    def result(self, timeout_s: float = 20) -> Any:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the child was not ended"
        return self._out[0]


@pytest.fixture
def started() -> Iterator[Callable[[Callable[[], Any]], Background]]:
    """Start a run in the background and return once its child is live."""
    before = sandbox.live()

    def start(call: Callable[[], Any]) -> Background:
        bg = Background(call)
        _until(lambda: sandbox.live() > before, "the child to start")
        return bg

    yield start
    _until(lambda: sandbox.live() == before, "every child to be reaped")


# --- the session ------------------------------------------------------------------------------------------


def test_a_child_runs_in_its_own_session_so_the_terminals_ctrl_c_never_reaches_it() -> None:
    with sandbox.spawn(["sleep", "30"]) as child:
        assert os.getsid(child.pid) == child.pid != os.getsid(0)
        assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
        child.interrupt()
    assert child.ending() is sandbox.Ending.INTERRUPTED and sandbox.live() == 0


def test_the_prefix_keeps_the_limits() -> None:
    # prlimit stays first (test_render_argv pins the CPU soft:hard gap on it); the namespace, the uid and the
    # orphan guard are put around it by spawn
    argv = sandbox.prefix(10, 2**30, prlimit="/usr/bin/prlimit")
    assert argv == [
        "/usr/bin/prlimit",
        f"--as={2**30}",
        "--cpu=10:11",
        f"--nofile={sandbox.NOFILE}",
        f"--fsize={isolation.policy().max_file_bytes}",
        "--",
    ]


# --- ffmpeg (derive.run_ffmpeg) ---------------------------------------------------------------------------


@pytest.mark.parametrize("sig", ["INT", "TERM", "HUP"])
def test_a_child_killed_by_a_stop_signal_is_interrupted_and_retryable(fake: Callable[[str], Path], sig: str) -> None:
    # nobody here sent it (a service manager, an operator): the signal itself says "stop", not "bad input"
    with pytest.raises(derive.MediaInterrupted) as info:
        derive.run_ffmpeg([str(fake(f"kill -{sig} $$"))], LIMITS)
    assert info.value.retryable and f"interrupted by SIG{sig}" in info.value.message


def test_a_child_killed_by_sigxcpu_is_a_rejection(fake: Callable[[str], Path]) -> None:
    with pytest.raises(derive.MediaError) as info:
        derive.run_ffmpeg([str(fake("kill -XCPU $$"))], LIMITS)
    assert not isinstance(info.value, derive.MediaInterrupted)
    assert not info.value.retryable and info.value.message == "ffmpeg killed by SIGXCPU (resource limit)"


def test_the_kernels_cpu_limit_really_ends_a_child_as_a_rejection() -> None:
    done = sandbox.run(
        sandbox.prefix(1, 2**30) + ["sh", "-c", "while :; do :; done"], timeout_s=30, env={"PATH": os.environ["PATH"]}
    )
    assert done.returncode == -signal.SIGXCPU and done.ending is sandbox.Ending.KILLED


def test_our_timeout_is_a_rejection_even_for_a_child_that_traps_signals(fake: Callable[[str], Path]) -> None:
    with pytest.raises(derive.MediaError) as info:
        derive.run_ffmpeg([str(fake(TRAPS_LIKE_FFMPEG))], MediaLimits(timeout_s=0.5))
    assert not isinstance(info.value, derive.MediaInterrupted)
    assert not info.value.retryable and info.value.message == "ffmpeg timed out after 0.5s"


def test_ffmpeg_exiting_255_when_nobody_here_stopped_it_stays_a_limit_rejection(fake: Callable[[str], Path]) -> None:
    with pytest.raises(derive.MediaError) as info:
        derive.run_ffmpeg([str(fake("exit 255"))], LIMITS)
    assert not isinstance(info.value, derive.MediaInterrupted)
    assert not info.value.retryable and info.value.message == "ffmpeg stopped by a signal (resource limit)"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_ffmpeg_exiting_after_we_stopped_its_group_is_interrupted(
    fake: Callable[[str], Path], started: Callable[[Callable[[], Any]], Background], sig: int
) -> None:
    # SIGINT/SIGTERM: it traps them and exits 255 — the same status as SIGXCPU; only our record tells them apart
    script = fake(TRAPS_LIKE_FFMPEG)
    run = started(lambda: derive.run_ffmpeg([str(script)], LIMITS))
    _trapping(script)
    with sandbox.stopping(sig) as stopped:
        error = run.result()
    assert stopped == 1
    assert isinstance(error, derive.MediaInterrupted) and error.retryable
    assert error.message == "ffmpeg interrupted (this process is stopping it)"


def test_while_stopping_no_new_child_starts(fake: Callable[[str], Path], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with sandbox.stopping(), pytest.raises(derive.MediaInterrupted, match="not started"):
        derive.run_ffmpeg([str(fake(f"touch {marker}"))], LIMITS)
    assert not marker.exists()
    derive.run_ffmpeg([str(fake(f"touch {marker}"))], LIMITS)  # the block is over: children start again
    assert marker.exists()


def test_an_interrupted_profile_stops_the_rest_of_the_job(
    tmp_path: Path, started: Callable[[Callable[[], Any]], Background], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every profile after an interrupted one is reported interrupted without being tried."""
    from aivedio_engine.domain.status import DerivativeProfile
    from aivedio_engine.media.probe import ProbeResult, StreamInfo

    calls: list[str] = []
    real = derive.run_ffmpeg

    def slow(argv: list[str], limits: MediaLimits, hide: Any = ()) -> None:
        calls.append(argv[0])
        real(["sleep", "30"], limits)

    monkeypatch.setattr(derive, "run_ffmpeg", slow)
    video = StreamInfo(0, "video", "h264", 320, 240, None, 1.0)
    probe = ProbeResult("mov,mp4", 1.0, (video,), {})
    profiles = [DerivativeProfile.PROXY_MP4, DerivativeProfile.HLS, DerivativeProfile.THUMBNAIL]
    run = started(lambda: derive.build_derivatives(tmp_path / "src.mp4", probe, tmp_path / "out", profiles, LIMITS))
    with sandbox.stopping():
        results = run.result()
    assert len(calls) == 1  # only the proxy was started
    assert [results[p].status for p in profiles] == ["FAILED"] * 3
    assert all(results[p].interrupted and results[p].retryable for p in profiles)
    assert results[DerivativeProfile.HLS].error == "not built: ffmpeg interrupted (this process is stopping it)"


# --- ffprobe (probe.run_ffprobe) ---------------------------------------------------------------------------


def _probe_with(fake: Path, tmp_path: Path, limits: MediaLimits = LIMITS) -> Any:
    target = tmp_path / "clip.mp4"
    target.write_bytes(b"\0")
    return run_ffprobe(target, "video", limits, ffprobe=str(fake))


def test_an_interrupted_probe_is_never_a_rejection(fake: Callable[..., Path], tmp_path: Path) -> None:
    with pytest.raises(ProbeInterrupted, match="interrupted by SIGTERM"):
        _probe_with(fake("kill -TERM $$", "fake-ffprobe"), tmp_path)
    # ProbeUnavailable: upload validation answers "unavailable, try again" instead of rejecting the upload
    assert issubclass(ProbeInterrupted, ProbeUnavailable) and not issubclass(ProbeInterrupted, ProbeError)


def test_a_probe_stopped_by_us_is_interrupted_and_one_killed_by_a_limit_is_rejected(
    fake: Callable[..., Path], tmp_path: Path, started: Callable[[Callable[[], Any]], Background]
) -> None:
    script = fake(TRAPS_LIKE_FFMPEG, "fake-ffprobe")
    run = started(lambda: _probe_with(script, tmp_path))
    _trapping(script)
    with sandbox.stopping(signal.SIGINT):
        assert isinstance(run.result(), ProbeInterrupted)
    with pytest.raises(ProbeError, match=r"killed by SIGXCPU \(resource limit\)"):
        _probe_with(fake("kill -XCPU $$", "fake-ffprobe2"), tmp_path)
    with pytest.raises(ProbeError, match="timed out"):
        _probe_with(fake(TRAPS_LIKE_FFMPEG, "fake-ffprobe3"), tmp_path, MediaLimits(timeout_s=0.3))


# --- Child.ending, the record first -------------------------------------------------------------------------


def test_the_first_recorded_reason_wins_and_a_clean_exit_is_always_a_clean_exit() -> None:
    with sandbox.spawn(["sleep", "30"]) as child:
        child.expire()
        child.interrupt()  # a shutdown right after our timeout fired: still our timeout
    assert child.ending() is sandbox.Ending.TIMEOUT and child.describe() == "timed out"
    with sandbox.spawn(["true"]) as done:
        done.wait()
        done.interrupt()  # reaped already: no signal is sent to a pid that may be someone else's by now
    assert done.ending() is sandbox.Ending.EXITED and done.stopped_by is None


def test_a_trapped_sigint_we_sent_reads_as_ours_though_the_status_is_ffmpegs_255(
    fake: Callable[[str], Path], started: Callable[[Callable[[], Any]], Background]
) -> None:
    script = fake(TRAPS_LIKE_FFMPEG)
    run = started(lambda: sandbox.run([str(script)], timeout_s=20, env={"PATH": os.environ["PATH"]}))
    _trapping(script)
    with sandbox.stopping(signal.SIGINT):
        done = run.result()
    assert done.returncode == 255 and done.ending is sandbox.Ending.INTERRUPTED


def test_an_external_signal_to_the_group_of_a_child_that_dies_of_it_is_an_interruption() -> None:
    with sandbox.spawn(["sleep", "30"], stdout=subprocess.DEVNULL) as child:
        os.killpg(child.pid, signal.SIGINT)  # as an operator's `kill -INT -PGID` would
        code = child.wait()
    assert code == -signal.SIGINT and child.ending() is sandbox.Ending.INTERRUPTED
    assert child.describe() == "interrupted by SIGINT"
