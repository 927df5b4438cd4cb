"""Derivatives made by the real ffmpeg from lavfi clips, checked with ffprobe and by reading the files' bytes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from aivedio_engine.domain.status import DerivativeProfile as P
from aivedio_engine.media import derive, sandbox
from aivedio_engine.media.derive import (
    DerivativeResult,
    MediaError,
    MediaUnavailable,
    build_derivatives,
    content_type_for,
    job_dir,
    run_ffmpeg,
)
from aivedio_engine.media.probe import MediaLimits, ProbeResult, StreamInfo, probe_file

LIMITS = MediaLimits(timeout_s=60)
BUILDERS = (
    derive.proxy_mp4_argv,
    derive.hls_argv,
    derive.hls_from_proxy_argv,
    derive.thumbnail_argv,
    derive.waveform_argv,
)


def _ffmpeg(*args: str) -> None:
    subprocess.run(
        ["ffmpeg", "-nostdin", "-hide_banner", "-v", "error", "-y", *args], check=True, capture_output=True, timeout=60
    )


def _clip(dst: Path, size: str, seconds: int, audio: bool) -> Path:
    sine = ["-f", "lavfi", "-i", f"sine=frequency=440:duration={seconds}"] if audio else []
    _ffmpeg(
        "-f",
        "lavfi",
        "-i",
        f"testsrc2=size={size}:rate=25:duration={seconds}",
        *sine,
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-pix_fmt",
        "yuv420p",
        *(["-c:a", "aac"] if audio else []),
        "-shortest",
        str(dst),
    )
    return dst


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("derive-src")
    return {
        "av": _clip(d / "av.mp4", "320x240", 3, audio=True),
        "silent": _clip(d / "silent.mp4", "320x240", 1, audio=False),
        "hd": _clip(d / "hd.mp4", "1280x720", 1, audio=True),
        # portrait with a short side just over 720, and an aspect that does not divide evenly
        "tall": _clip(d / "tall.mp4", "738x1002", 1, audio=False),
    }


@pytest.fixture(scope="module")
def probes(clips: dict[str, Path]) -> dict[str, ProbeResult]:
    return {name: probe_file(path, "video", LIMITS) for name, path in clips.items()}


@pytest.fixture(scope="module")
def av(
    clips: dict[str, Path], probes: dict[str, ProbeResult], tmp_path_factory: pytest.TempPathFactory
) -> dict[P, DerivativeResult]:
    return build_derivatives(clips["av"], probes["av"], tmp_path_factory.mktemp("av-out"), list(P), LIMITS)


def _ffprobe(path: Path) -> dict:
    out = subprocess.run(
        [
            "ffprobe",
            "-v",
            "error",
            "-protocol_whitelist",
            "file",
            "-print_format",
            "json",
            "-show_format",
            "-show_streams",
            f"file:{path}",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return json.loads(out.stdout)


def _streams(path: Path, kind: str) -> list[dict]:
    return [s for s in _ffprobe(path)["streams"] if s["codec_type"] == kind]


def _top_level_boxes(path: Path) -> list[str]:
    data = path.read_bytes()
    boxes, pos = [], 0
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if size == 1:
            size = struct.unpack(">Q", data[pos + 8 : pos + 16])[0]
        elif size == 0:
            size = len(data) - pos
        assert size >= 8, f"malformed box at {pos}"
        boxes.append(kind.decode("latin-1"))
        pos += size
    assert pos == len(data), "boxes do not tile the file"
    return boxes


def _ready(result: DerivativeResult) -> DerivativeResult:
    assert result.status == "READY", result.error
    return result


# --- real encodes ----------------------------------------------------------------------------------------


def test_proxy_is_faststart_h264_aac_without_upscaling(av: dict[P, DerivativeResult]) -> None:
    proxy = _ready(av[P.PROXY_MP4])
    assert proxy.files == [proxy.main] and proxy.content_type == "video/mp4"
    (video,), (audio,) = _streams(proxy.main, "video"), _streams(proxy.main, "audio")
    assert video["codec_name"] == "h264" and video["pix_fmt"] == "yuv420p" and video["profile"] == "High"
    assert (video["width"], video["height"]) == (320, 240)
    assert audio["codec_name"] == "aac"
    assert abs(float(_ffprobe(proxy.main)["format"]["duration"]) - 3) < 0.2
    boxes = _top_level_boxes(proxy.main)
    assert boxes.index("moov") < boxes.index("mdat"), boxes


@pytest.mark.parametrize(("clip", "size"), [("hd", (1280, 720)), ("tall", (720, 978))])
def test_proxy_short_side_is_at_most_720_with_even_sides(
    clip: str, size: tuple[int, int], clips: dict[str, Path], probes: dict[str, ProbeResult], tmp_path: Path
) -> None:
    proxy = _ready(build_derivatives(clips[clip], probes[clip], tmp_path, [P.PROXY_MP4], LIMITS)[P.PROXY_MP4])
    (video,) = _streams(proxy.main, "video")
    width, height = video["width"], video["height"]
    assert (width, height) == size and width % 2 == 0 and height % 2 == 0
    source = probes[clip].video
    assert source is not None and abs(width / height - source.width / source.height) < 0.01
    # a silent source gets a silent proxy rather than an invented audio track
    assert len(_streams(proxy.main, "audio")) == (1 if clip == "hd" else 0)


def test_hls_is_fmp4_vod_with_relative_names(av: dict[P, DerivativeResult]) -> None:
    hls = _ready(av[P.HLS])
    playlist = hls.main
    assert playlist is not None and playlist.name == "index.m3u8" and hls.files[0] == playlist
    text = playlist.read_text()
    assert '#EXT-X-MAP:URI="init.mp4"' in text and "#EXT-X-PLAYLIST-TYPE:VOD" in text and "#EXT-X-ENDLIST" in text
    segments = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(segments) >= 2 and all("/" not in s and s.endswith(".m4s") for s in segments)
    assert str(playlist.parent) not in text
    assert hls.files == [playlist, playlist.parent / "init.mp4", *(playlist.parent / s for s in segments)]
    assert all(f.is_file() and f.stat().st_size > 0 for f in hls.files)
    assert [content_type_for(f) for f in hls.files[:3]] == [
        "application/vnd.apple.mpegurl",
        "video/mp4",
        "video/iso.segment",
    ]
    assert hls.content_type == "application/vnd.apple.mpegurl"
    doc = _ffprobe(playlist)
    assert abs(float(doc["format"]["duration"]) - 3) <= 0.5
    assert {s["codec_name"] for s in doc["streams"]} == {"h264", "aac"}


def test_thumbnail_is_a_jpeg_at_most_640_wide(
    av: dict[P, DerivativeResult], clips: dict[str, Path], probes: dict[str, ProbeResult], tmp_path: Path
) -> None:
    thumb = _ready(av[P.THUMBNAIL])
    assert thumb.content_type == "image/jpeg" and thumb.main.read_bytes()[:3] == b"\xff\xd8\xff"
    (small,) = _streams(thumb.main, "video")
    assert (small["width"], small["height"]) == (320, 240)
    big = _ready(build_derivatives(clips["hd"], probes["hd"], tmp_path, [P.THUMBNAIL], LIMITS)[P.THUMBNAIL])
    (scaled,) = _streams(big.main, "video")
    assert (scaled["width"], scaled["height"]) == (640, 360)


def test_waveform_is_a_png_only_when_there_is_audio(
    av: dict[P, DerivativeResult], clips: dict[str, Path], probes: dict[str, ProbeResult], tmp_path: Path
) -> None:
    wave = _ready(av[P.WAVEFORM])
    assert wave.content_type == "image/png" and wave.main.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (picture,) = _streams(wave.main, "video")
    assert (picture["width"], picture["height"]) == (1280, 240)
    silent = build_derivatives(clips["silent"], probes["silent"], tmp_path, ["waveform", "thumbnail"], LIMITS)
    assert silent[P.WAVEFORM].status == "SKIPPED" and silent[P.WAVEFORM].files == []
    assert silent[P.THUMBNAIL].status == "READY"
    with pytest.raises(ValueError, match="audio"):
        derive.waveform_argv(clips["silent"], tmp_path / "w.png", probes["silent"], LIMITS)


# --- failures --------------------------------------------------------------------------------------------


def test_truncated_source_fails_every_profile_without_leaking_paths(
    clips: dict[str, Path], probes: dict[str, ProbeResult], tmp_path: Path
) -> None:
    good = clips["av"].read_bytes()
    broken = tmp_path / "src" / "broken.mp4"
    broken.parent.mkdir()
    broken.write_bytes(good[: len(good) // 3])  # no moov: the probe passed on the whole file, not on this
    work = tmp_path / "work"
    results = build_derivatives(broken, probes["av"], work, list(P), LIMITS)
    assert set(results) == set(P)
    for profile, result in results.items():
        assert result.status == "FAILED" and not result.retryable and result.files == [], profile
        assert result.error and str(tmp_path) not in result.error and "file:" not in result.error, result.error
        assert not (work / profile.value).exists(), "partial output must not be left for the uploader"
    assert "moov atom not found" in results[P.PROXY_MP4].error


def test_one_failing_profile_does_not_stop_the_others(
    clips: dict[str, Path], probes: dict[str, ProbeResult], tmp_path: Path
) -> None:
    # a probe that claims audio for a silent file: every audio mapping fails, the picture-only ones do not
    lying = dataclasses.replace(probes["silent"], streams=probes["av"].streams)
    results = build_derivatives(clips["silent"], lying, tmp_path, [P.PROXY_MP4, P.THUMBNAIL, P.WAVEFORM], LIMITS)
    assert [r.status for r in results.values()] == ["FAILED", "READY", "FAILED"]
    assert "matches no streams" in (results[P.PROXY_MP4].error or "")
    assert results[P.THUMBNAIL].main.is_file()


def test_timeout_is_a_non_retryable_media_error(
    clips: dict[str, Path], probes: dict[str, ProbeResult], tmp_path: Path
) -> None:
    tiny = dataclasses.replace(LIMITS, timeout_s=0.01)
    argv = derive.proxy_mp4_argv(clips["hd"], tmp_path / "p.mp4", probes["hd"], tiny)
    with pytest.raises(MediaError, match="timed out after 0.01s") as caught:
        run_ffmpeg(argv, tiny)
    assert not caught.value.retryable and not isinstance(caught.value, MediaUnavailable)
    result = build_derivatives(clips["hd"], probes["hd"], tmp_path / "w", [P.HLS], tiny)[P.HLS]
    assert result.status == "FAILED" and "timed out" in (result.error or "") and not result.retryable


def test_memory_cap_is_a_non_retryable_media_error(
    clips: dict[str, Path], probes: dict[str, ProbeResult], tmp_path: Path
) -> None:
    if shutil.which("prlimit") is None:
        pytest.skip("no prlimit: the address-space cap cannot be applied")
    # enough to load ffmpeg's libraries, too little for a 720p x264 encoder and its threads
    capped = dataclasses.replace(LIMITS, memory_limit_bytes=400 * 1024 * 1024)
    result = build_derivatives(clips["hd"], probes["hd"], tmp_path, [P.PROXY_MP4], capped)[P.PROXY_MP4]
    # the same encode succeeds uncapped (parametrized proxy test); which allocation fails first, and so the
    # message, varies with the machine's thread count, so only the classification is asserted
    assert result.status == "FAILED" and not result.retryable and result.error, result


def test_missing_ffmpeg_is_ours_to_retry(tmp_path: Path) -> None:
    with pytest.raises(MediaUnavailable) as caught:
        run_ffmpeg([str(tmp_path / "no-such-ffmpeg"), "-version"], LIMITS)
    assert caught.value.retryable and str(tmp_path) not in caught.value.message


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("kill -KILL $$", "SIGKILL"),
        ("kill -XCPU $$", "SIGXCPU"),
        ("exit 255", "stopped by a signal"),  # ffmpeg's own exit after it caught SIGXCPU from the CPU cap
        ("echo 'x264 [error]: malloc of size 16388 failed' >&2; exit 1", "out of memory"),
        ("echo 'Failed to inject frame into filter network: Cannot allocate memory' >&2; exit 1", "out of memory"),
    ],
)
def test_resource_limits_are_not_retried(script: str, reason: str) -> None:
    with pytest.raises(MediaError, match="resource limit") as caught:
        run_ffmpeg(["/bin/sh", "-c", script], LIMITS)
    assert reason in caught.value.message and not caught.value.retryable


def test_error_messages_name_no_local_path(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here.mp4"
    with pytest.raises(MediaError) as caught:
        run_ffmpeg(
            [
                "ffmpeg",
                "-nostdin",
                "-hide_banner",
                "-loglevel",
                "error",
                "-protocol_whitelist",
                "file",
                "-i",
                f"file:{missing}",
                "-f",
                "null",
                "-",
            ],
            LIMITS,
        )
    assert "No such file or directory" in caught.value.message and not caught.value.retryable
    assert str(tmp_path) not in caught.value.message


# --- argv builders (pure) --------------------------------------------------------------------------------


def _hand_probe(duration: float | None, audio: bool = True) -> ProbeResult:
    streams = [StreamInfo(0, "video", "h264", 640, 360, None, duration)]
    if audio:
        streams.append(StreamInfo(1, "audio", "aac", None, None, None, duration))
    return ProbeResult("mov,mp4,m4a,3gp,3g2,mj2", duration, tuple(streams), {})


def _values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


@pytest.mark.parametrize("builder", BUILDERS)
def test_every_input_is_a_whitelisted_local_file(builder, tmp_path: Path) -> None:
    argv = builder(Path("rel/src.mp4"), tmp_path / "out", _hand_probe(3.0), LIMITS)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv) and argv[0] == "ffmpeg"
    inputs = [i for i, a in enumerate(argv) if a == "-i"]
    assert inputs
    for i in inputs:
        assert argv[i + 1] == f"file:{Path('rel/src.mp4').resolve()}"
        options = argv[:i]
        assert options[options.index("-protocol_whitelist") + 1] == "file"
        assert options[options.index("-format_whitelist") + 1] == "mov,mp4,matroska,webm"
    for flag in ("-nostdin", "-y", "-hide_banner"):
        assert flag in argv
    assert _values(argv, "-loglevel") == ["error"]
    assert _values(argv, "-map_metadata") == ["-1"] and _values(argv, "-map_chapters") == ["-1"]
    assert _values(argv, "-t") == ["3"]
    outputs = [a for a in argv if a.startswith("file:")][1:]
    assert outputs and all(Path(o[len("file:") :]).is_absolute() for o in outputs)


@pytest.mark.parametrize("duration", [1e9, None, float("inf"), -5.0])
@pytest.mark.parametrize("builder", BUILDERS)
def test_duration_is_capped_whatever_the_container_claims(builder, duration: float | None, tmp_path: Path) -> None:
    argv = builder(Path("/in/src.mp4"), tmp_path / "out", _hand_probe(duration), LIMITS)
    assert _values(argv, "-t") == ["60"]


def test_silent_source_gets_no_audio_and_thumbnail_time_follows_duration(tmp_path: Path) -> None:
    argv = derive.proxy_mp4_argv(Path("/in/src.mp4"), tmp_path / "p.mp4", _hand_probe(3.0, audio=False), LIMITS)
    assert "-an" in argv and "0:a:0" not in argv and "-c:a" not in argv
    with_audio = derive.proxy_mp4_argv(Path("/in/src.mp4"), tmp_path / "p.mp4", _hand_probe(3.0), LIMITS)
    assert "-an" not in with_audio and _values(with_audio, "-c:a") == ["aac"]
    assert _values(with_audio, "-movflags") == ["+faststart"]
    short = derive.thumbnail_argv(Path("/in/src.mp4"), tmp_path / "t.jpg", _hand_probe(0.5), LIMITS)
    long = derive.thumbnail_argv(Path("/in/src.mp4"), tmp_path / "t.jpg", _hand_probe(30.0), LIMITS)
    assert _values(short, "-ss") == ["0.25"] and _values(long, "-ss") == ["1"]


def test_hls_argv_aligns_keyframes_with_segments(tmp_path: Path) -> None:
    argv = derive.hls_argv(Path("/in/src.mp4"), tmp_path / "hls", _hand_probe(3.0), LIMITS)
    assert _values(argv, "-f") == ["hls"] and _values(argv, "-hls_segment_type") == ["fmp4"]
    assert _values(argv, "-hls_time") == ["2"] and _values(argv, "-hls_playlist_type") == ["vod"]
    assert _values(argv, "-force_key_frames") == ["expr:gte(t,n_forced*2)"]
    assert argv[-1] == f"file:{(tmp_path / 'hls' / 'index.m3u8').resolve()}"


def test_the_proxy_keeps_keyframes_on_segment_boundaries_so_hls_is_a_remux(tmp_path: Path) -> None:
    proxy = derive.proxy_mp4_argv(Path("/in/src.mp4"), tmp_path / "p.mp4", _hand_probe(3.0), LIMITS)
    assert _values(proxy, "-force_key_frames") == ["expr:gte(t,n_forced*2)"]
    remux = derive.hls_from_proxy_argv(tmp_path / "p.mp4", tmp_path / "hls", _hand_probe(3.0), LIMITS)
    assert _values(remux, "-c") == ["copy"] and "libx264" not in remux and "-filter_complex" not in remux
    assert _values(remux, "-f") == ["hls"] and _values(remux, "-hls_time") == ["2"]
    assert _values(remux, "-map") == ["0:v:0", "0:a:0"]
    silent = derive.hls_from_proxy_argv(tmp_path / "p.mp4", tmp_path / "hls", _hand_probe(3.0, audio=False), LIMITS)
    assert _values(silent, "-map") == ["0:v:0"]


@pytest.mark.parametrize("duration", [3.0, 1e9, None])
def test_the_combined_run_keeps_every_fence_of_the_single_runs(duration: float | None, tmp_path: Path) -> None:
    argv = derive.combined_argv(Path("rel/src.mp4"), tmp_path, _hand_probe(duration), LIMITS, list(P))
    (i,) = [i for i, a in enumerate(argv) if a == "-i"]  # one input, read once
    assert argv[i + 1] == f"file:{Path('rel/src.mp4').resolve()}"
    assert _values(argv[:i], "-protocol_whitelist") == ["file"] and _values(argv[:i], "-t") == [
        "3" if duration == 3.0 else "60"
    ]
    assert _values(argv[:i], "-format_whitelist") == ["mov,mp4,matroska,webm"]
    assert _values(argv[:i], "-codec_whitelist") and _values(argv[:i], "-max_pixels") == [str(LIMITS.max_pixels)]
    # three outputs (tee of proxy + HLS, thumbnail, waveform), each stripped and bitexact
    assert _values(argv, "-map_metadata") == ["-1"] * 3 and _values(argv, "-map_chapters") == ["-1"] * 3
    assert _values(argv, "-fflags") == ["+bitexact"] * 3
    assert _values(argv, "-force_key_frames") == ["expr:gte(t,n_forced*2)"]
    assert _values(argv, "-ss") == ["1"]  # an output seek: the decode is shared with the encode
    (tee,) = [a for a in argv if "f\\=hls" in a]
    proxy, hls = tee.split("|")
    assert proxy.startswith("\\[f\\=mp4\\:movflags\\=+faststart\\:onfail\\=abort\\]file\\:/")
    assert "hls_time\\=2" in hls and "hls_segment_type\\=fmp4" in hls and "onfail\\=abort" in hls
    assert hls.endswith(f"file\\:{tmp_path.resolve()}/hls/index.m3u8")
    silent = derive.combined_argv(Path("/in/src.mp4"), tmp_path, _hand_probe(3.0, audio=False), LIMITS, [P.PROXY_MP4])
    assert "-an" in silent and "0:a:0" not in silent and _values(silent, "-f") == ["mp4"]
    with pytest.raises(ValueError, match="audio"):
        derive.combined_argv(Path("/in/src.mp4"), tmp_path, _hand_probe(3.0, audio=False), LIMITS, [P.WAVEFORM])


def _recording(monkeypatch: pytest.MonkeyPatch, fail_when=lambda argv: False) -> list[list[str]]:  # type: ignore[no-untyped-def]
    """Every argv `derive` hands to `run_ffmpeg`; `fail_when(argv)` runs fail as an out-of-memory run would."""
    runs: list[list[str]] = []
    real = derive.run_ffmpeg

    def record(argv, limits, hide=()):  # type: ignore[no-untyped-def]
        runs.append(list(argv))
        if fail_when(list(argv)):
            raise MediaError("ffmpeg ran out of memory (resource limit)")
        return real(argv, limits, hide)

    monkeypatch.setattr(derive, "run_ffmpeg", record)
    return runs


def _combined(argv: list[str]) -> bool:
    return _values(argv, "-f")[:1] == ["tee"]


def _encoders(argv: list[str]) -> list[str]:
    return [c for c in _values(argv, "-c:v") + _values(argv, "-c") if c != "copy"]


def _digests(root: Path) -> dict[str, str]:
    return {str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(root.rglob("*.*"))}


def test_every_profile_comes_out_of_one_run_with_one_encode(
    clips: dict[str, Path], probes: dict[str, ProbeResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _recording(monkeypatch)
    results = build_derivatives(
        clips["av"], probes["av"], tmp_path, [P.HLS, P.THUMBNAIL, P.WAVEFORM, P.PROXY_MP4], LIMITS
    )
    assert list(results) == [P.PROXY_MP4, P.HLS, P.THUMBNAIL, P.WAVEFORM]  # the proxy first, whatever the config
    assert all(_ready(r) for r in results.values())
    (run,) = runs
    # the proxy and the HLS take the same H.264 packets (tee); the thumbnail and the waveform are pictures
    assert _encoders(run) == ["libx264", "mjpeg", "png"] and run.count("-i") == 1
    assert _values(run, "-f") == ["tee", "image2", "image2"]
    hls = results[P.HLS]
    segments = [line for line in hls.main.read_text().splitlines() if line.startswith("#EXTINF:")]
    assert len(segments) >= 2 and all(float(s[len("#EXTINF:") :].rstrip(",")) <= 2.1 for s in segments)
    doc = _ffprobe(hls.main)
    assert abs(float(doc["format"]["duration"]) - 3) <= 0.5
    assert {s["codec_name"] for s in doc["streams"]} == {"h264", "aac"}


def test_a_derivation_starts_one_ffprobe_and_one_ffmpeg(
    clips: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    real = sandbox.spawn

    def spawn(argv, **popen):  # type: ignore[no-untyped-def]
        started.append(next(Path(a).name for a in argv if Path(a).name in ("ffmpeg", "ffprobe")))
        return real(argv, **popen)

    monkeypatch.setattr(sandbox, "spawn", spawn)
    for clip in ("av", "silent"):  # with audio (+ waveform) and without (waveform skipped)
        started.clear()
        probe = probe_file(clips[clip], "video", LIMITS)
        results = build_derivatives(clips[clip], probe, tmp_path / clip, list(P), LIMITS)
        assert {r.status for r in results.values()} == ({"READY"} if clip == "av" else {"READY", "SKIPPED"})
        assert started == ["ffprobe", "ffmpeg"], clip


@pytest.mark.parametrize("clip", ["av", "silent"])
def test_one_run_makes_the_same_bytes_every_time_and_as_the_single_profile_runs(
    clip: str, clips: dict[str, Path], probes: dict[str, ProbeResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = build_derivatives(clips[clip], probes[clip], tmp_path / "first", list(P), LIMITS)
    again = build_derivatives(clips[clip], probes[clip], tmp_path / "again", list(P), LIMITS)
    assert first.keys() == again.keys() and all(r.status in ("READY", "SKIPPED") for r in first.values())
    combined = _digests(tmp_path / "first")
    assert combined and combined == _digests(tmp_path / "again")
    # the one-by-one path (after a failed combined run) must upload the same bytes under the same keys
    runs = _recording(monkeypatch, fail_when=_combined)
    single = build_derivatives(clips[clip], probes[clip], tmp_path / "single", list(P), LIMITS)
    assert [r.status for r in single.values()] == [r.status for r in first.values()]
    assert len(runs) == 1 + sum(r.status == "READY" for r in first.values())
    assert _digests(tmp_path / "single") == combined


def test_when_the_combined_run_fails_hls_is_cut_from_the_proxy(
    clips: dict[str, Path], probes: dict[str, ProbeResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = _recording(monkeypatch, fail_when=_combined)
    results = build_derivatives(clips["av"], probes["av"], tmp_path, [P.HLS, P.PROXY_MP4], LIMITS)
    assert [_values(r, "-f") for r in runs] == [["tee"], ["mp4"], ["hls"]]  # the proxy first, then cut from it
    assert sum("libx264" in r for r in runs[1:]) == 1 and _values(runs[2], "-c") == ["copy"]
    hls = _ready(results[P.HLS])
    segments = [line for line in hls.main.read_text().splitlines() if line.startswith("#EXTINF:")]
    assert len(segments) >= 2 and all(float(s[len("#EXTINF:") :].rstrip(",")) <= 2.1 for s in segments)
    doc = _ffprobe(hls.main)
    assert abs(float(doc["format"]["duration"]) - 3) <= 0.5
    assert {s["codec_name"] for s in doc["streams"]} == {"h264", "aac"}


def test_hls_is_encoded_from_the_source_when_there_is_no_proxy(
    clips: dict[str, Path], probes: dict[str, ProbeResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every run that writes the proxy fails (the combined one and the proxy's own)
    runs = _recording(monkeypatch, fail_when=lambda argv: bool({"mp4", "tee"} & set(_values(argv, "-f"))))
    alone = build_derivatives(clips["av"], probes["av"], tmp_path / "alone", [P.HLS], LIMITS)
    assert _ready(alone[P.HLS]) and len(runs) == 1 and "libx264" in runs[0]

    runs.clear()
    fallback = build_derivatives(clips["av"], probes["av"], tmp_path / "fallback", [P.PROXY_MP4, P.HLS], LIMITS)
    assert fallback[P.PROXY_MP4].status == "FAILED" and _ready(fallback[P.HLS])
    assert len(runs) == 3 and "libx264" in runs[2] and _values(runs[2], "-c") == []  # encoded, not cut


def test_an_output_that_fails_in_the_combined_run_fails_only_its_profile(
    clips: dict[str, Path],
    probes: dict[str, ProbeResult],
    av: dict[P, DerivativeResult],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a segment name ffmpeg cannot open: only the HLS output breaks, in the combined run as on its own
    monkeypatch.setattr(derive, "HLS_SEGMENT_PATTERN", "no-such-dir/seg_%03d.m4s")
    runs = _recording(monkeypatch)
    results = build_derivatives(clips["av"], probes["av"], tmp_path, list(P), LIMITS)
    assert [_values(r, "-f") for r in runs] == [["tee", "image2", "image2"], ["mp4"], ["hls"], ["image2"], ["image2"]]
    hls = results[P.HLS]
    assert hls.status == "FAILED" and hls.files == [] and "Failed to open" in (hls.error or "")
    assert str(tmp_path) not in (hls.error or "") and not (tmp_path / "hls").exists()
    for profile in (P.THUMBNAIL, P.WAVEFORM):  # READY, and the bytes of a clean run
        assert _ready(results[profile]).main.read_bytes() == av[profile].main.read_bytes(), profile  # type: ignore[union-attr]
    # the proxy re-made alone: READY with the clean run's decoded frames and samples (its container bytes differed
    # once in ~3 full runs on a loaded box; byte equality of the two paths has its own test)
    assert _framemd5(_ready(results[P.PROXY_MP4]).main) == _framemd5(av[P.PROXY_MP4].main)  # type: ignore[union-attr]


def _framemd5(path: Path) -> list[str]:
    out = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(path), "-f", "framemd5", "-"], capture_output=True, check=True, text=True
    ).stdout
    return [line for line in out.splitlines() if not line.startswith("#")]


def test_an_unwritable_output_dir_is_a_retryable_failure_of_its_profile_alone(
    clips: dict[str, Path], probes: dict[str, ProbeResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "hls").write_bytes(b"in the way")  # the HLS directory cannot be made
    runs = _recording(monkeypatch)
    results = build_derivatives(clips["av"], probes["av"], tmp_path, [P.PROXY_MP4, P.HLS, P.THUMBNAIL], LIMITS)
    assert [r.status for r in results.values()] == ["READY", "FAILED", "READY"]
    hls = results[P.HLS]
    # READY proxy, FAILED but retryable HLS: the task retries the media step instead of failing
    assert hls.retryable and not hls.interrupted and hls.error == "local I/O error: File exists"
    assert [_values(r, "-f") for r in runs] == [["mp4"], ["image2"]]  # the combined run never started


# --- helpers ---------------------------------------------------------------------------------------------


def test_job_dir_is_removed_even_when_the_job_raises(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), job_dir(tmp_path) as work:
        (work / "nested").mkdir()
        (work / "nested" / "partial.mp4").write_bytes(b"x")
        seen = work
        raise RuntimeError("the encode blew up")
    assert seen.parent == tmp_path and not seen.exists()
    with job_dir(tmp_path) as first, job_dir(tmp_path) as second:
        assert first != second and first.is_dir() and second.is_dir()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("proxy.mp4", "video/mp4"),
        ("index.m3u8", "application/vnd.apple.mpegurl"),
        ("seg_007.m4s", "video/iso.segment"),
        ("thumb.JPG", "image/jpeg"),
        ("waveform.png", "image/png"),
        ("notes.txt", "application/octet-stream"),
    ],
)
def test_content_type_for(name: str, expected: str) -> None:
    assert content_type_for(Path(name)) == expected


def test_u26_source_metadata_never_reaches_a_derivative(tmp_path: Path) -> None:
    """U26: location and other tags of the source (a phone's GPS, a comment, a title) are
    not copied into anything we serve; the thumbnail JPEG carries no EXIF at all."""
    src = tmp_path / "tagged.mp4"
    _ffmpeg(
        "-f",
        "lavfi",
        "-i",
        "testsrc2=size=320x240:rate=25:duration=2",
        "-f",
        "lavfi",
        "-i",
        "sine=frequency=440:duration=2",
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-pix_fmt",
        "yuv420p",
        "-c:a",
        "aac",
        "-shortest",
        "-metadata",
        "location=+40.6892-074.0445/",
        "-metadata",
        "comment=secret-gps-note",
        "-metadata",
        "title=private title",
        "-metadata:s:v",
        "handler_name=SecretCam",
        str(src),
    )
    assert _ffprobe(src)["format"]["tags"]["location"]  # the source really carries them
    results = build_derivatives(src, probe_file(src, "video", LIMITS), tmp_path / "out", list(P), LIMITS)
    for profile in (P.PROXY_MP4, P.HLS):
        doc = _ffprobe(_ready(results[profile]).main)  # type: ignore[arg-type]
        tags = {**doc["format"].get("tags", {}), **{k: v for s in doc["streams"] for k, v in s.get("tags", {}).items()}}
        text = json.dumps(tags)
        assert "40.6892" not in text and "secret" not in text.lower() and "private title" not in text, tags
    jpeg = _ready(results[P.THUMBNAIL]).main.read_bytes()  # type: ignore[union-attr]
    assert b"Exif" not in jpeg[:4096] and b"40.6892" not in jpeg


def test_an_output_missing_after_a_clean_exit_fails_only_its_profile(
    clips: dict[str, Path], probes: dict[str, ProbeResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a container that claims 30 s for a 1 s clip: the thumbnail seek (1 s) lands past the last frame, so that
    # output gets no frame while ffmpeg still ends well; the others are whole
    lying = dataclasses.replace(probes["silent"], duration_s=30.0)
    runs = _recording(monkeypatch)
    results = build_derivatives(clips["silent"], lying, tmp_path, [P.PROXY_MP4, P.HLS, P.THUMBNAIL], LIMITS)
    assert [r.status for r in results.values()] == ["READY", "READY", "FAILED"]
    assert results[P.THUMBNAIL].error == "thumbnail produced no output" and not results[P.THUMBNAIL].retryable
    assert [_values(r, "-f") for r in runs] == [["tee", "image2"], ["mp4"], ["hls"], ["image2"]]


def test_a_tee_output_ffmpeg_drops_is_noticed_and_built_on_its_own(
    clips: dict[str, Path],
    probes: dict[str, ProbeResult],
    av: dict[P, DerivativeResult],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # unescaped, the colon of `file:` in the segment option breaks the HLS slave's spec: ffmpeg drops that output,
    # writes the proxy and exits 0
    monkeypatch.setattr(derive.ffgraph, "_tee_escape", lambda text: text)
    runs = _recording(monkeypatch)
    results = build_derivatives(clips["av"], probes["av"], tmp_path, list(P), LIMITS)
    assert [_values(r, "-f") for r in runs] == [["tee", "image2", "image2"], ["mp4"], ["hls"], ["image2"], ["image2"]]
    assert all(_ready(r) for r in results.values())
    assert [f.read_bytes() for f in results[P.HLS].files] == [f.read_bytes() for f in av[P.HLS].files]
