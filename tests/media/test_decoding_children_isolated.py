"""Every child that decodes user input runs like the derive step's: under a uid of its own per job, in a network
namespace of its own, with the job's process limit. Seen from inside the child, as an attacker's input would see
it: ffmpeg is wrapped by a script that records its uid, its network namespace and its process limit, then runs
the real ffmpeg. Checked for the `local` provider's render of a reference image and for a System B media step
(the photo check's statistics run). Needs root (the per-job uid) and network namespaces; each says why when it
cannot run."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from aivedio_engine.config import Settings
from aivedio_engine.media import derive, isolation
from aivedio_engine.media.probe import MediaLimits
from aivedio_engine.providers.base import Accepted, GenerationRequest, JobStatus
from aivedio_engine.providers.local import LocalProvider
from aivedio_engine.workflows import executors
from tests.media.test_local_provider import FakeClock, wait_for

CAPS = isolation.capabilities()
pytestmark = [
    pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg"),
    pytest.mark.skipif(CAPS.setpriv is None, reason=f"no per-job uid here: {CAPS.user_note}"),
    pytest.mark.skipif(not CAPS.netns, reason=f"no network namespace here: {CAPS.netns_note}"),
]
PHOTO = Path(__file__).resolve().parents[2] / "examples" / "photo_story" / "photo.png"
MAX_PROCESSES = 48


@pytest.fixture(autouse=True)
def policy() -> Iterator[None]:
    """The default policy with a recognisable process limit (process-wide: restored after)."""
    before = isolation.policy()
    isolation.configure(isolation.Policy(max_processes=MAX_PROCESSES))
    yield
    isolation.configure(before)


class Spy:
    """A wrapped ffmpeg, where a pool uid can run it, and what each of its runs saw."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.record = root / "seen"
        self.record.mkdir()
        self.record.chmod(0o777)  # written by whichever uid the child runs as
        self.ffmpeg = root / "ffmpeg"
        real = shutil.which("ffmpeg")
        self.ffmpeg.write_text(
            "#!/bin/sh\n"
            "nproc=$(awk '/^Max processes/ {print $3}' /proc/self/limits)\n"
            f'echo "$(id -u) $(readlink /proc/self/ns/net) $nproc" > "{self.record}/$$"\n'
            f'exec "{real}" "$@"\n'
        )
        self.ffmpeg.chmod(0o755)

    def runs(self) -> list[tuple[int, str, str]]:
        seen = []
        for entry in self.record.iterdir():
            uid, netns, nproc = entry.read_text().split()
            seen.append((int(uid), netns, nproc))
        return seen

    def assert_isolated(self) -> None:
        runs = self.runs()
        assert runs, "the wrapped ffmpeg never ran"
        ours = os.readlink("/proc/self/ns/net")
        for uid, netns, nproc in runs:
            assert uid != os.geteuid(), f"ran as the engine's uid {uid}"
            pool = isolation.policy()
            assert pool.uid_base <= uid < pool.uid_base + pool.uid_count
            assert netns != ours, "ran in the engine's network namespace"
            assert nproc == str(MAX_PROCESSES), f"process limit {nproc}"


@pytest.fixture
def spy() -> Iterator[Spy]:
    root = Path(tempfile.mkdtemp(prefix="aivedio-spy-"))
    root.chmod(0o755)
    try:
        yield Spy(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def private_copy(src: Path, tmp_path: Path) -> Path:
    """The user's image where users' files are: readable by the engine only."""
    dst = tmp_path / "private" / src.name
    dst.parent.mkdir(mode=0o700)
    shutil.copyfile(src, dst)
    dst.chmod(stat.S_IRUSR | stat.S_IWUSR)
    return dst


def test_the_local_providers_render_of_a_reference_image_runs_isolated(tmp_path: Path, spy: Spy) -> None:
    image = private_copy(PHOTO, tmp_path)
    provider = LocalProvider(
        "local",
        Settings().providers["local"],
        data_dir=tmp_path / "data",
        clock=FakeClock(),
        fps=12,
        preset="ultrafast",
        render_timeout_s=60,
        ffmpeg_bin=str(spy.ffmpeg),
    )
    try:
        request = GenerationRequest(
            prompt="a lighthouse at dusk",
            model="local-v1",
            duration_s=1,
            resolution="360p",
            aspect_ratio="16:9",
            seed=3,
            reference_urls=[image.as_uri()],
        )
        accepted = provider.submit(request, "key-isolated")
        assert isinstance(accepted, Accepted), accepted
        obs = wait_for(provider, accepted.job_id, JobStatus.SUCCEEDED, JobStatus.FAILED)
        assert obs.status is JobStatus.SUCCEEDED, (obs.error_code, obs.error_message)
        served = provider.root / f"{accepted.job_id}.mp4"
        assert served.stat().st_size > 0 and served.stat().st_uid == os.geteuid()  # handed back to the engine
    finally:
        provider.close()
    spy.assert_isolated()


def test_a_system_b_media_step_on_the_users_photo_runs_isolated(tmp_path: Path, spy: Spy) -> None:
    photo = private_copy(PHOTO, tmp_path)
    store = SimpleNamespace(download_to=lambda key, dst: shutil.copyfile(photo, dst))
    with derive.job_dir() as workdir:  # where the runner makes each step's directory
        run = executors.Run(
            step=cast(Any, None),
            project=cast(Any, None),
            outputs={},
            workdir=workdir,
            store=cast(Any, store),
            limits=MediaLimits(timeout_s=60, workdir=workdir),
            generate=cast(Any, None),
            publish=cast(Any, None),
            photo_key=lambda: "photo-key",
            note_key=cast(Any, None),
            find_live=cast(Any, None),
            ffmpeg=str(spy.ffmpeg),
        )
        done = executors.photo_check(run)
    assert done.output["width"] > 0
    spy.assert_isolated()


def test_the_spy_sees_a_child_that_is_not_isolated(tmp_path: Path, spy: Spy) -> None:
    """The control: the same wrapper run outside the sandbox records the engine's uid and namespace, so the
    assertions above can fail."""
    subprocess.run([str(spy.ffmpeg), "-hide_banner", "-version"], capture_output=True, check=True, timeout=30)
    with pytest.raises(AssertionError, match="engine's uid"):
        spy.assert_isolated()
