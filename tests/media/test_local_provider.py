"""The `local` provider against real ffmpeg: renders, progress, dedupe, cancel, timeouts, and its loopback file
server (signed expiring URLs, no traversal). Clips are short and 12 fps with x264 ultrafast to stay fast."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from aivedio_engine.config import Settings
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.providers.base import (
    Accepted,
    CallbackRejected,
    Canceled,
    GenerationRequest,
    JobStatus,
    NotFound,
    Observation,
    Provider,
    QueryFailed,
    Rejected,
    TooLate,
)
from aivedio_engine.providers.local import LocalProvider

DEADLINE_S = 30.0


class FakeClock:
    def __init__(self) -> None:
        self.at = datetime.now(UTC)

    def now(self) -> datetime:
        return self.at


@pytest.fixture(scope="module")
def png(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ref") / "reference.png"
    subprocess.run(
        [
            "ffmpeg",
            "-nostdin",
            "-v",
            "error",
            "-f",
            "lavfi",
            "-i",
            "testsrc2=size=480x320",
            "-frames:v",
            "1",
            "-y",
            str(path),
        ],
        check=True,
        timeout=30,
    )
    return path


@pytest.fixture
def make_provider(tmp_path: Path) -> Iterator[Callable[..., LocalProvider]]:
    made: list[LocalProvider] = []

    def make(data_dir: Path | None = None, **options: Any) -> LocalProvider:
        settings = Settings().providers["local"]
        options = {"fps": 12, "preset": "ultrafast", "render_timeout_s": 60, **options}
        provider = LocalProvider("local", settings, data_dir=data_dir or tmp_path, **options)
        made.append(provider)
        return provider

    yield make
    for provider in made:
        provider.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def provider(make_provider: Callable[..., LocalProvider], clock: FakeClock) -> LocalProvider:
    return make_provider(clock=clock)


def _request(prompt: str = "a lighthouse at dusk", **fields: Any) -> GenerationRequest:
    values: dict[str, Any] = {
        "model": "local-v1",
        "duration_s": 2,
        "resolution": "360p",
        "aspect_ratio": "16:9",
        "seed": 3,
        **fields,
    }
    return GenerationRequest(prompt=prompt, **values)


def _submit(provider: LocalProvider, request: GenerationRequest, key: str) -> str:
    result = provider.submit(request, key)
    assert isinstance(result, Accepted), result
    return result.job_id


def wait_for(
    provider: LocalProvider, job_id: str, *statuses: JobStatus, until: Callable[[Observation], bool] | None = None
) -> Observation:
    """Poll the job until it reaches one of `statuses` (and `until` holds), failing at the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        obs = provider.query(job_id)
        assert isinstance(obs, Observation)
        if obs.status in statuses and (until is None or until(obs)):
            return obs
        assert time.monotonic() < deadline, f"job stuck in {obs.status} ({obs.error_code}: {obs.error_message})"
        time.sleep(0.02)


def _download(url: str, dest: Path) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 (our own loopback server)
        dest.write_bytes(resp.read())
        return resp.status, resp.headers["Content-Type"]


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _raw_get(provider: LocalProvider, path: str, method: str = "GET") -> int:
    """Send the path byte-for-byte (urllib would normalise some of it)."""
    conn = http.client.HTTPConnection("127.0.0.1", int(provider.base_url.rsplit(":", 1)[1]), timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", "127.0.0.1")
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


def _probe(path: Path) -> dict[str, Any]:
    out = subprocess.run(
        ["ffprobe", "-v", "error", "-print_format", "json", "-show_format", "-show_streams", str(path)],
        capture_output=True,
        check=True,
        timeout=30,
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _assert_clip(path: Path, size: tuple[int, int], duration_s: float) -> None:
    doc = _probe(path)
    video = [s for s in doc["streams"] if s["codec_type"] == "video"]
    audio = [s for s in doc["streams"] if s["codec_type"] == "audio"]
    assert len(video) == 1 and len(audio) == 1
    assert video[0]["codec_name"] == "h264" and (video[0]["width"], video[0]["height"]) == size
    assert video[0]["pix_fmt"] == "yuv420p" and audio[0]["codec_name"] == "aac"
    assert abs(float(doc["format"]["duration"]) - duration_s) < 0.15
    assert "mp4" in doc["format"]["format_name"]
    # +faststart: the index (moov) comes before the media data, so playback starts before the download ends
    head = path.read_bytes()[:4096]
    assert 0 <= head.find(b"moov") < head.find(b"mdat") or b"mdat" not in head


def _fetch_output(obs: Observation, dest: Path) -> Path:
    assert obs.status is JobStatus.SUCCEEDED and obs.progress == 100 and len(obs.outputs) == 1
    output = obs.outputs[0]
    assert output.url.startswith("http://127.0.0.1:") and output.content_type == "video/mp4"
    assert output.expires_at is not None and output.expires_at > datetime.now(UTC)
    status, content_type = _download(output.url, dest)
    assert status == 200 and content_type == "video/mp4" and dest.stat().st_size == output.size_bytes
    return dest


# --- rendering ------------------------------------------------------------------------------------------------


def test_is_a_provider_without_callbacks(provider: LocalProvider) -> None:
    assert isinstance(provider, Provider)
    caps = provider.capabilities
    assert caps.models == ("local-v1",) and caps.resolutions == ("360p", "720p") and caps.max_duration_s == 10
    assert not caps.supports_callbacks and caps.supports_lookup_by_request_key and caps.supports_cancel
    with pytest.raises(CallbackRejected):
        provider.parse_callback({"webhook-id": "x"}, b"{}", datetime.now(UTC))


def test_renders_from_a_reference_image(provider: LocalProvider, png: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    job_id = _submit(provider, _request(reference_urls=[png.as_uri()]), "key-image")
    obs = wait_for(provider, job_id, JobStatus.SUCCEEDED, JobStatus.FAILED)
    elapsed = time.monotonic() - started
    assert obs.request_key == "key-image" and obs.error_code is None
    _assert_clip(_fetch_output(obs, tmp_path / "image.mp4"), (640, 360), 2.0)
    print(f"360p 2 s from image: {elapsed:.2f} s")


@pytest.mark.parametrize(
    ("seed", "aspect", "size"),
    [
        (0, "16:9", (640, 360)),  # gradients
        (1, "9:16", (360, 640)),  # testsrc2
        (5, "1:1", (360, 360)),  # mandelbrot
    ],
)
def test_renders_a_generated_background(
    provider: LocalProvider, tmp_path: Path, seed: int, aspect: str, size: tuple[int, int]
) -> None:
    started = time.monotonic()
    job_id = _submit(provider, _request(seed=seed, aspect_ratio=aspect), f"key-gen-{seed}")
    obs = wait_for(provider, job_id, JobStatus.SUCCEEDED, JobStatus.FAILED)
    elapsed = time.monotonic() - started
    _assert_clip(_fetch_output(obs, tmp_path / "gen.mp4"), size, 2.0)
    print(f"360p 2 s generated (seed {seed}): {elapsed:.2f} s")


def test_a_hostile_prompt_renders_literally(make_provider: Callable[..., LocalProvider], tmp_path: Path) -> None:
    """Quotes, colons, brackets, %{...} and newlines in the prompt; filtergraph syntax in the data dir path."""
    provider = make_provider(data_dir=tmp_path / "data: it's [odd],dir;x")
    prompt = (
        "He said \"don't\": 50% off; [in]drawtext=text='x':fontfile=/etc/passwd[out]\n"
        "%{eif\\:1/0\\:d} %{pts} %{localtime} \\ back\\slash\r\nthird\tline\x00 日本"
    )
    job_id = _submit(provider, _request(prompt, seed=None), "key-hostile")
    obs = wait_for(provider, job_id, JobStatus.SUCCEEDED, JobStatus.FAILED)
    _assert_clip(_fetch_output(obs, tmp_path / "hostile.mp4"), (640, 360), 2.0)


def test_without_a_font_the_caption_is_skipped(make_provider: Callable[..., LocalProvider], tmp_path: Path) -> None:
    provider = make_provider(font_file=None)
    job_id = _submit(provider, _request(duration_s=1), "key-nofont")
    obs = wait_for(provider, job_id, JobStatus.SUCCEEDED, JobStatus.FAILED)
    _assert_clip(_fetch_output(obs, tmp_path / "nofont.mp4"), (640, 360), 1.0)


def test_same_seed_gives_the_same_bytes(provider: LocalProvider, png: Path) -> None:
    request = _request(duration_s=1, seed=42, reference_urls=[png.as_uri()])
    jobs = [_submit(provider, request, f"key-seed-{i}") for i in range(2)]
    assert jobs[0] != jobs[1]
    for job_id in jobs:
        wait_for(provider, job_id, JobStatus.SUCCEEDED, JobStatus.FAILED)
    digests = {hashlib.sha256((provider.root / f"{j}.mp4").read_bytes()).hexdigest() for j in jobs}
    assert len(digests) == 1


def test_progress_is_reported_while_running(make_provider: Callable[..., LocalProvider]) -> None:
    provider = make_provider(realtime=True)
    job_id = _submit(provider, _request(duration_s=2), "key-progress")
    running = wait_for(provider, job_id, JobStatus.RUNNING, until=lambda o: (o.progress or 0) >= 20)
    assert running.progress is not None and 20 <= running.progress < 100 and not running.outputs
    done = wait_for(provider, job_id, JobStatus.SUCCEEDED, JobStatus.FAILED)
    assert done.status is JobStatus.SUCCEEDED and done.progress == 100


# --- idempotency and lookup -----------------------------------------------------------------------------------


def test_the_same_request_key_returns_the_same_job(provider: LocalProvider) -> None:
    first = _submit(provider, _request(duration_s=1), "key-dup")
    again = _submit(provider, _request(duration_s=1), "key-dup")
    other = _submit(provider, _request(duration_s=1), "key-other")
    assert first == again != other
    found = provider.find("key-dup")
    assert isinstance(found, Observation) and found.job_id == first and found.request_key == "key-dup"
    assert isinstance(provider.find("never-submitted"), NotFound)
    assert isinstance(provider.query("loc_" + "0" * 32), NotFound)
    wait_for(provider, first, JobStatus.SUCCEEDED)
    assert _submit(provider, _request(duration_s=1), "key-dup") == first  # also after it finished
    wait_for(provider, other, JobStatus.SUCCEEDED)
    assert {p.name for p in provider.root.glob("*.mp4")} == {f"{first}.mp4", f"{other}.mp4"}  # two renders, not 3


def test_concurrent_submits_with_one_key_make_one_job(provider: LocalProvider) -> None:
    barrier = threading.Barrier(8)

    def submit() -> str:
        barrier.wait()
        return _submit(provider, _request(duration_s=1), "key-race")

    with ThreadPoolExecutor(8) as pool:
        job_ids = set(pool.map(lambda _: submit(), range(8)))
    assert len(job_ids) == 1
    wait_for(provider, job_ids.pop(), JobStatus.SUCCEEDED)
    assert len(list(provider.root.glob("*.mp4"))) == 1


def test_finished_jobs_are_forgotten_after_the_retention(provider: LocalProvider, clock: FakeClock) -> None:
    job_id = _submit(provider, _request(duration_s=1), "key-old")
    wait_for(provider, job_id, JobStatus.SUCCEEDED)
    clock.at += timedelta(hours=23)
    _submit(provider, _request(duration_s=1), "key-new-1")
    assert isinstance(provider.query(job_id), Observation)  # still within the retention
    clock.at += timedelta(hours=2)
    _submit(provider, _request(duration_s=1), "key-new-2")
    assert isinstance(provider.query(job_id), NotFound) and isinstance(provider.find("key-old"), NotFound)
    assert not (provider.root / f"{job_id}.mp4").exists()


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"model": "gen-9"}, "unsupported_model"),
        ({"resolution": "1080p"}, "unsupported_resolution"),
        ({"duration_s": 11}, "unsupported_duration"),
        ({"duration_s": 0}, "unsupported_duration"),
        ({"aspect_ratio": "wide"}, "unsupported_aspect_ratio"),
        ({"reference_urls": ["https://example.com/cat.png"]}, "reference_unreadable"),
        ({"reference_urls": ["file:///nonexistent/cat.png"]}, "reference_unreadable"),
    ],
)
def test_invalid_requests_are_rejected_before_any_job(
    provider: LocalProvider, fields: dict[str, Any], code: str
) -> None:
    result = provider.submit(_request(**fields), "key-bad")
    assert isinstance(result, Rejected) and result.code == code
    assert result.error_class is ErrorClass.PROVIDER_REJECTED
    assert isinstance(provider.find("key-bad"), NotFound)


# --- failure, timeout, cancel ---------------------------------------------------------------------------------


def test_ffmpeg_failure_fails_the_job_with_a_code(provider: LocalProvider, tmp_path: Path) -> None:
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("#EXTM3U\n#EXTINF:1,\nhttp://127.0.0.1:9/x.ts\n")
    job_id = _submit(provider, _request(reference_urls=[not_an_image.as_uri()]), "key-broken")
    obs = wait_for(provider, job_id, JobStatus.FAILED, JobStatus.SUCCEEDED)
    assert obs.status is JobStatus.FAILED and obs.error_code == "render_failed" and obs.error_message
    assert str(tmp_path) not in obs.error_message and not obs.outputs
    # the render thread clears its scratch after the job's end is visible: close() waits for it
    provider.close()
    assert not list(provider.root.glob("*.mp4")) and not any((provider.root / ".work").iterdir())


def test_a_render_over_its_timeout_fails(make_provider: Callable[..., LocalProvider]) -> None:
    provider = make_provider(realtime=True, render_timeout_s=0.5)
    job_id = _submit(provider, _request(duration_s=10), "key-slow")
    obs = wait_for(provider, job_id, JobStatus.FAILED, JobStatus.SUCCEEDED)
    assert obs.status is JobStatus.FAILED and obs.error_code == "render_timeout"


def test_cancel_stops_ffmpeg(make_provider: Callable[..., LocalProvider]) -> None:
    provider = make_provider(realtime=True)
    job_id = _submit(provider, _request(duration_s=10), "key-cancel")
    wait_for(provider, job_id, JobStatus.RUNNING, until=lambda o: provider.process_id(job_id) is not None)
    pid = provider.process_id(job_id)
    assert pid is not None
    assert isinstance(provider.cancel(job_id), Canceled)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    obs = provider.query(job_id)
    assert isinstance(obs, Observation) and obs.status is JobStatus.CANCELED and not obs.outputs
    assert isinstance(provider.cancel(job_id), Canceled)  # idempotent
    assert not (provider.root / f"{job_id}.mp4").exists()


def test_cancel_of_a_queued_job_never_starts_it(make_provider: Callable[..., LocalProvider]) -> None:
    provider = make_provider(realtime=True)
    busy = [_submit(provider, _request(duration_s=10, seed=i), f"key-busy-{i}") for i in range(4)]
    queued = _submit(provider, _request(duration_s=10), "key-queued")  # max_concurrency is 4
    assert isinstance(provider.cancel(queued), Canceled)
    for job_id in busy:
        assert isinstance(provider.cancel(job_id), Canceled)
    obs = provider.query(queued)
    assert isinstance(obs, Observation) and obs.status is JobStatus.CANCELED and obs.progress == 0


def test_cancel_after_success_is_too_late_and_unknown_jobs_fail(provider: LocalProvider) -> None:
    job_id = _submit(provider, _request(duration_s=1), "key-done")
    wait_for(provider, job_id, JobStatus.SUCCEEDED)
    assert isinstance(provider.cancel(job_id), TooLate)
    assert isinstance(provider.cancel("loc_" + "f" * 32), QueryFailed)


# --- the loopback file server ---------------------------------------------------------------------------------


def test_output_urls_expire_and_cannot_be_forged(provider: LocalProvider, clock: FakeClock) -> None:
    job_id = _submit(provider, _request(duration_s=1), "key-url")
    obs = wait_for(provider, job_id, JobStatus.SUCCEEDED)
    url = obs.outputs[0].url
    assert _status(url) == 200
    assert _status(url.replace("sig=", "sig=0")) == 403
    assert _status(url.split("&sig=")[0]) == 403
    assert _status(url.split("?")[0]) == 403
    expires = int(url.split("expires=")[1].split("&")[0])
    assert _status(url.replace(f"expires={expires}", f"expires={expires + 3600}")) == 403
    clock.at += timedelta(seconds=provider.capabilities.output_url_ttl_s or 0, minutes=1)
    assert _status(url) == 403
    fresh = provider.query(job_id)
    assert isinstance(fresh, Observation) and fresh.outputs[0].url != url and _status(fresh.outputs[0].url) == 200


def test_only_finished_outputs_are_served(provider: LocalProvider) -> None:
    job_id = _submit(provider, _request(duration_s=1), "key-paths")
    wait_for(provider, job_id, JobStatus.SUCCEEDED)
    (provider.root / "secret.txt").write_text("not for you")
    url = provider.output_url(job_id)
    query = url.split("?", 1)[1]
    assert _raw_get(provider, url.split(provider.base_url, 1)[1]) == 200
    for path in [
        "/",
        "/outputs/",
        "/outputs",
        "/secret.txt",
        "/.work/",
        f"/{job_id}.mp4?{query}",
        f"/outputs/../../../../etc/passwd?{query}",
        f"/outputs/..%2f..%2f..%2fetc%2fpasswd?{query}",
        f"/outputs/%2e%2e/secret.txt?{query}",
        f"/outputs/{job_id}.mp4/../secret.txt?{query}",
        f"/outputs/{job_id.upper()}.mp4?{query}",
        f"/outputs/{job_id}.MP4?{query}",
        f"/outputs/{job_id}.mp4%00.txt?{query}",
        f"/outputs/{job_id}.mp4/?{query}",
    ]:
        assert _raw_get(provider, path) == 404, path
    missing = "loc_" + "a" * 32  # a well-signed URL for a job that has no file
    assert _raw_get(provider, provider.output_url(missing).split(provider.base_url, 1)[1]) == 404
    assert _raw_get(provider, url.split(provider.base_url, 1)[1], method="POST") == 501
    assert _raw_get(provider, url.split(provider.base_url, 1)[1], method="DELETE") == 501


def test_close_stops_the_server_and_refuses_new_jobs(make_provider: Callable[..., LocalProvider]) -> None:
    provider = make_provider(realtime=True)
    job_id = _submit(provider, _request(duration_s=10), "key-close")
    wait_for(provider, job_id, JobStatus.RUNNING, until=lambda o: provider.process_id(job_id) is not None)
    pid = provider.process_id(job_id)
    assert pid is not None
    provider.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    obs = provider.query(job_id)
    # stopped, not failed: nothing was delivered or billed, so the engine may submit again
    assert isinstance(obs, Observation) and obs.status is JobStatus.ABORTED and obs.error_code == "provider_closed"
    result = provider.submit(_request(), "key-after-close")
    assert isinstance(result, Rejected) and result.code == "provider_closed"
    with pytest.raises(OSError):
        _raw_get(provider, "/")
    provider.close()  # idempotent


def test_a_relative_data_dir_renders_too(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The embedded default is data_dir=".aivedio", relative to the working directory."""
    from aivedio_engine.config import ProviderSettings
    from aivedio_engine.providers.base import Accepted, GenerationRequest, JobStatus, Observation
    from aivedio_engine.providers.local import LocalProvider
    from tests.support.sim import wait_until

    monkeypatch.chdir(tmp_path)
    provider = LocalProvider("local", ProviderSettings(adapter="local"), data_dir=Path(".aivedio"))
    try:
        accepted = provider.submit(
            GenerationRequest(
                prompt="relative", model="local-v1", duration_s=1, resolution="360p", aspect_ratio="16:9"
            ),
            "rel-1",
        )
        assert isinstance(accepted, Accepted)

        def finished() -> Observation | None:
            obs = provider.query(accepted.job_id)
            return (
                obs if isinstance(obs, Observation) and obs.status in (JobStatus.SUCCEEDED, JobStatus.FAILED) else None
            )

        obs = wait_until(finished, timeout_s=60, what="render finished")
        assert obs.status is JobStatus.SUCCEEDED, obs.error_message
    finally:
        provider.close()
