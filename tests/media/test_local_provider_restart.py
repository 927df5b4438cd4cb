"""The `local` provider when its renders are stopped rather than failed, and after a restart of its process.

A Ctrl-C'd `aivedio generate` (or a stopping `aivedio serve`) stops renders mid-way; the next instance on the
same data dir must still answer for those jobs, or the engine polls a NotFound until the task expires. Real
ffmpeg throughout; a second LocalProvider on the same data dir stands for the restarted process.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from aivedio_engine.media import sandbox
from aivedio_engine.providers.base import JobStatus, NotFound, Observation
from aivedio_engine.providers.local import LocalProvider
from tests.media.test_local_provider import (  # noqa: F401 - fixtures
    _download,
    _request,
    _submit,
    clock,
    make_provider,
    provider,
    wait_for,
)


def _rendering(provider: LocalProvider, job_id: str) -> int:
    obs = wait_for(provider, job_id, JobStatus.RUNNING, until=lambda o: provider.process_id(job_id) is not None)
    assert obs.status is JobStatus.RUNNING
    pid = provider.process_id(job_id)
    assert pid is not None
    return pid


def test_a_render_runs_in_its_own_session(make_provider: Callable[..., LocalProvider]) -> None:
    provider = make_provider(realtime=True)
    pid = _rendering(provider, _submit(provider, _request(duration_s=10), "key-session"))
    assert os.getsid(pid) == pid != os.getsid(0)  # a terminal's Ctrl-C to our group never reaches ffmpeg


def test_a_render_the_engine_stops_is_aborted_not_failed_and_a_new_instance_says_so_too(
    make_provider: Callable[..., LocalProvider], tmp_path: Path
) -> None:
    provider = make_provider(realtime=True)
    job_id = _submit(provider, _request(duration_s=10), "key-stopped")
    _rendering(provider, job_id)
    with sandbox.stopping():  # what the embedded engine does on its way out (Ctrl-C)
        obs = wait_for(provider, job_id, JobStatus.ABORTED, JobStatus.FAILED)
    assert obs.status is JobStatus.ABORTED and obs.error_code == "render_interrupted", obs
    assert obs.error_message == "the render was interrupted (this process is stopping it)"
    provider.close()

    again = make_provider(data_dir=tmp_path)  # the process that rendered it is gone
    recovered = again.query(job_id)
    assert isinstance(recovered, Observation) and recovered.status is JobStatus.ABORTED
    assert recovered.error_code == "render_interrupted" and not recovered.outputs


def test_a_stop_signal_nobody_here_sent_is_read_from_the_status_as_before(
    make_provider: Callable[..., LocalProvider],
) -> None:
    """ffmpeg traps SIGTERM and exits 255, as on SIGXCPU: without our own record, that is a failed render."""
    provider = make_provider(realtime=True)
    job_id = _submit(provider, _request(duration_s=10), "key-term")
    pid = _rendering(provider, job_id)
    wait_for(provider, job_id, JobStatus.RUNNING, until=lambda o: (o.progress or 0) > 0)  # ffmpeg's traps are set
    os.kill(pid, signal.SIGTERM)
    obs = wait_for(provider, job_id, JobStatus.ABORTED, JobStatus.FAILED)
    assert obs.status is JobStatus.FAILED and obs.error_code == "render_failed", obs


def test_renders_in_flight_when_the_provider_closes_are_aborted_for_the_next_instance(
    make_provider: Callable[..., LocalProvider], tmp_path: Path
) -> None:
    provider = make_provider(realtime=True)
    running = _submit(provider, _request(duration_s=10), "key-running")
    _rendering(provider, running)
    provider.close()

    again = make_provider(data_dir=tmp_path)
    obs = again.query(running)
    assert isinstance(obs, Observation) and obs.status is JobStatus.ABORTED and obs.error_code == "provider_closed"
    assert isinstance(again.query("loc_" + "1" * 32), NotFound)  # never existed: nothing to say about it


def test_a_render_that_finished_before_the_restart_is_served_by_the_new_instance(
    make_provider: Callable[..., LocalProvider], tmp_path: Path
) -> None:
    provider = make_provider()
    job_id = _submit(provider, _request(duration_s=1), "key-done")
    done = wait_for(provider, job_id, JobStatus.SUCCEEDED, JobStatus.FAILED)
    assert done.status is JobStatus.SUCCEEDED
    provider.close()

    again = make_provider(data_dir=tmp_path)
    obs = again.query(job_id)
    assert isinstance(obs, Observation) and obs.status is JobStatus.SUCCEEDED and obs.progress == 100
    (out,) = obs.outputs
    assert out.url.startswith(again.base_url) and out.size_bytes == done.outputs[0].size_bytes
    status, content_type = _download(out.url, tmp_path / "got.mp4")  # signed with the new instance's key
    assert (status, content_type) == (200, "video/mp4")
    assert (tmp_path / "got.mp4").stat().st_size == out.size_bytes


def test_tombstones_are_swept_with_the_outputs(make_provider: Callable[..., LocalProvider], tmp_path: Path) -> None:
    provider = make_provider(realtime=True)
    job_id = _submit(provider, _request(duration_s=10), "key-old")
    _rendering(provider, job_id)
    provider.close()
    tombstone = tmp_path / "local-provider" / ".aborted" / job_id
    assert tombstone.is_file()
    old = time.time() - 2 * 86400
    os.utime(tombstone, (old, old))
    again = make_provider(data_dir=tmp_path)  # sweeps what is older than the retention (a day)
    assert not tombstone.exists() and isinstance(again.query(job_id), NotFound)
