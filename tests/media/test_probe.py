"""Real ffprobe (Debian ffmpeg 5.1) on clips rendered with lavfi: the sandboxed runner plus the policy gate."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from aivedio_engine.media.probe import MediaLimits, ProbeError, ProbeUnavailable, probe_file, run_ffprobe
from tests.media import hls_playlist, shared_media
from tests.support.sockets import connections

LIMITS = MediaLimits(timeout_s=30)


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return shared_media(tmp_path_factory)


def test_real_mp4_passes_with_its_facts(media: dict[str, Path]) -> None:
    result = probe_file(media["clip.mp4"], "video", LIMITS)
    video = result.video
    assert video is not None and (video.width, video.height) == (320, 240)
    assert video.codec_name == "h264" and video.frame_rate == 25
    assert result.duration_ms == 1000 and "mp4" in result.format_name.split(",")
    assert [s.codec_type for s in result.streams] == ["video", "audio"]


def test_real_webm_and_png_pass(media: dict[str, Path]) -> None:
    webm = probe_file(media["clip.webm"], "video", LIMITS)
    assert webm.video is not None and webm.video.codec_name == "vp9" and webm.format_name == "matroska,webm"
    png = probe_file(media["image.png"], "image", LIMITS)
    assert png.format_name == "png_pipe" and png.video is not None and (png.video.width, png.video.height) == (320, 240)


def test_pixel_bomb_is_refused_before_decoding(media: dict[str, Path]) -> None:  # U13
    # -max_pixels makes ffprobe report 0x0 for the 4000x4000 image; the gate turns that into a rejection
    doc = run_ffprobe(media["bomb.png"], "image", LIMITS)
    assert doc["streams"][0]["width"] == 0
    with pytest.raises(ProbeError, match="pixel limit"):
        probe_file(media["bomb.png"], "image", LIMITS)
    # with a budget large enough it would be accepted: the limit, not the file, decides
    allowed = probe_file(media["bomb.png"], "image", MediaLimits(max_pixels=16_000_000, timeout_s=30))
    assert allowed.video is not None and allowed.video.width == 4000


def test_hls_playlist_disguised_as_mp4_never_touches_the_network(
    tmp_path: Path, listener: tuple[socket.socket, int]
) -> None:  # U8
    sock, port = listener
    evil = tmp_path / "evil.mp4"
    evil.write_bytes(hls_playlist(f"http://127.0.0.1:{port}/internal-admin/secret.ts"))
    with pytest.raises(ProbeError, match="whitelist"):
        probe_file(evil, "video", LIMITS)
    assert connections(sock) == 0


def test_ffconcat_and_text_are_refused(media: dict[str, Path]) -> None:  # U9
    with pytest.raises(ProbeError, match="whitelist"):
        probe_file(media["concat.mp4"], "video", LIMITS)
    with pytest.raises(ProbeError):
        probe_file(media["text.mp4"], "video", LIMITS)


def test_truncated_mp4_is_refused(media: dict[str, Path]) -> None:  # U19
    with pytest.raises(ProbeError, match="moov atom not found"):
        probe_file(media["truncated.mp4"], "video", LIMITS)


def test_too_many_streams_is_refused(media: dict[str, Path]) -> None:  # U18
    with pytest.raises(ProbeError, match="5 streams"):
        probe_file(media["five_streams.mp4"], "video", LIMITS)


def test_duration_and_fps_limits_apply_to_real_files(media: dict[str, Path]) -> None:
    with pytest.raises(ProbeError, match="duration 1.000s exceeds 0.5s"):
        probe_file(media["clip.mp4"], "video", MediaLimits(max_duration_s=0.5))
    with pytest.raises(ProbeError, match="frame rate 25"):
        probe_file(media["clip.mp4"], "video", MediaLimits(max_fps=24))


def test_family_whitelist_refuses_cross_family_files(media: dict[str, Path]) -> None:
    with pytest.raises(ProbeError, match="whitelist"):
        probe_file(media["image.png"], "video", LIMITS)
    with pytest.raises(ProbeError, match="whitelist"):
        probe_file(media["clip.mp4"], "image", LIMITS)


def test_error_reasons_do_not_leak_local_paths(media: dict[str, Path]) -> None:
    with pytest.raises(ProbeError) as info:
        probe_file(media["text.mp4"], "video", LIMITS)
    assert str(media["text.mp4"].parent) not in str(info.value)


def test_timeout_is_a_rejection(media: dict[str, Path]) -> None:  # U27
    with pytest.raises(ProbeError, match="timed out"):
        probe_file(media["clip.mp4"], "video", MediaLimits(timeout_s=0.001))


def test_missing_ffprobe_is_our_fault_not_the_uploads(media: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ProbeUnavailable):
        probe_file(media["clip.mp4"], "video", LIMITS, ffprobe=str(tmp_path / "no-such-ffprobe"))
