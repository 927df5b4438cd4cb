"""The pure parts of media validation: ffprobe argv, JSON parsing, the policy gate, and magic-number sniffing.

Hostile ffprobe output (target 3) must only ever produce a typed ProbeError or a
rejection reason — never a crash and never an acceptance of out-of-policy media.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aivedio_engine.config import Settings
from aivedio_engine.media import sniff
from aivedio_engine.media.probe import MediaLimits, ProbeError, check_policy, ffprobe_argv, parse_probe

LIMITS = MediaLimits()


def video_doc(**over: Any) -> dict[str, Any]:
    v = {
        "index": 0,
        "codec_type": "video",
        "codec_name": "h264",
        "width": 320,
        "height": 240,
        "avg_frame_rate": "25/1",
        "r_frame_rate": "25/1",
        "duration": "1.000000",
        "tags": {"title": "x" * 9999},
    }
    a = {"index": 1, "codec_type": "audio", "codec_name": "aac", "avg_frame_rate": "0/0", "duration": "1.0"}
    v.update(over.pop("video", {}))
    doc = {
        "format": {"format_name": "mov,mp4,m4a,3gp,3g2,mj2", "duration": "1.000000", "nb_streams": 2},
        "streams": [v, a],
    }
    doc["format"].update(over.pop("format", {}))
    if "streams" in over:
        doc["streams"] = over.pop("streams")
    assert not over
    return doc


def image_doc(**video: Any) -> dict[str, Any]:
    s = {
        "index": 0,
        "codec_type": "video",
        "codec_name": "png",
        "width": 640,
        "height": 480,
        "r_frame_rate": "25/1",
        "avg_frame_rate": "25/1",
    }
    s.update(video)
    return {"format": {"format_name": "png_pipe"}, "streams": [s]}


def verdict(doc: dict[str, Any], family: str = "video", limits: MediaLimits = LIMITS) -> str | None:
    return check_policy(parse_probe(doc), family, limits)


def test_limits_default_to_the_recommended_numbers() -> None:
    limits = MediaLimits.from_settings(Settings().media)
    assert limits.max_pixels == 8_294_400 and limits.max_streams == 4
    assert (limits.min_fps, limits.max_fps) == (1, 120)


def test_good_video_passes_and_facts_are_parsed() -> None:
    result = parse_probe(video_doc())
    assert check_policy(result, "video", LIMITS) is None
    assert result.video is not None and (result.video.width, result.video.height) == (320, 240)
    assert result.video.frame_rate == 25 and result.duration_ms == 1000
    # tags never reach the stored probe document (attacker-controlled text)
    assert all("tags" not in s for s in result.raw["streams"])


def test_good_image_passes() -> None:
    assert verdict(image_doc(), "image") is None
    assert verdict(image_doc(codec_name="mjpeg"), "image") is None


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (video_doc(video={"width": 0, "height": 0}), "pixel limit"),  # ffprobe's answer to a refused bomb (U14)
        (video_doc(video={"width": 7680, "height": 4320}), "exceeds 8294400 pixels"),  # 8K (U15)
        (video_doc(video={"width": -320}), "pixel limit"),
        (video_doc(video={"avg_frame_rate": "100000/1", "r_frame_rate": "100000/1"}), "frame rate"),  # U17
        (video_doc(video={"avg_frame_rate": "1/1000", "r_frame_rate": "1/1000"}), "frame rate"),
        (video_doc(video={"avg_frame_rate": "0/0", "r_frame_rate": "0/0"}), "frame rate unknown"),
        (video_doc(format={"duration": "1e9"}), "exceeds 60s"),  # U16
        (video_doc(format={"duration": "-5"}), "duration unknown"),
        (
            video_doc(
                format={"duration": "N/A"},
                video={"duration": "N/A"},
                streams=[
                    {"codec_type": "video", "codec_name": "h264", "width": 2, "height": 2, "avg_frame_rate": "25/1"}
                ],
            ),
            "duration unknown",
        ),
        (video_doc(format={"duration": "nan"}), None),  # falls back to the streams' 1 s
        (video_doc(format={"format_name": "hls"}), "container 'hls'"),  # U8
        (video_doc(format={"format_name": "concat"}), "container 'concat'"),  # U9
        (video_doc(format={"format_name": "avi"}), "container 'avi'"),  # U12
        (video_doc(format={"format_name": "png_pipe"}), "not allowed for video"),
        (video_doc(video={"codec_name": "prores"}), "video codec 'prores'"),
        (video_doc(streams=[{"codec_type": "audio", "codec_name": "aac"}]), "no video stream"),
        (video_doc(streams=[]), "no streams"),
        (
            video_doc(streams=[video_doc()["streams"][0]] + [{"codec_type": "audio", "codec_name": "aac"}] * 4),
            "5 streams (limit 4)",
        ),  # U18
        (
            video_doc(streams=[video_doc()["streams"][0], {"codec_type": "attachment", "codec_name": "ttf"}]),
            "stream type 'attachment'",
        ),
        (
            video_doc(streams=[video_doc()["streams"][0], {"codec_type": "audio", "codec_name": "wmav2"}]),
            "audio codec 'wmav2'",
        ),
    ],
)
def test_gate_rejects_out_of_policy_video(doc: dict[str, Any], expected: str | None) -> None:
    reason = verdict(doc)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (image_doc(width=16000, height=16000), "exceeds"),  # U13
        (image_doc(width=0, height=0), "pixel limit"),
        (image_doc(codec_name="gif"), "image codec 'gif'"),
        ({"format": {"format_name": "png_pipe"}, "streams": [image_doc()["streams"][0]] * 2}, "exactly one stream"),
        ({"format": {"format_name": "mov,mp4,m4a,3gp,3g2,mj2"}, "streams": image_doc()["streams"]}, "not allowed"),
    ],
)
def test_gate_rejects_out_of_policy_images(doc: dict[str, Any], expected: str) -> None:
    reason = verdict(doc, "image")
    assert reason is not None and expected in reason


def test_limits_come_from_settings() -> None:
    assert verdict(video_doc(), limits=MediaLimits(max_duration_s=0.5)) is not None
    assert verdict(video_doc(), limits=MediaLimits(max_pixels=320 * 240 - 1)) is not None
    assert verdict(video_doc(), limits=MediaLimits(max_fps=24)) is not None
    assert verdict(video_doc(), limits=MediaLimits(max_streams=1)) is not None


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"format": {}},
        {"streams": []},
        {"format": [], "streams": []},
        {"format": {}, "streams": {}},
        {"format": {}, "streams": [1]},
    ],
)
def test_malformed_documents_are_probe_errors(doc: dict[str, Any]) -> None:
    with pytest.raises(ProbeError):
        parse_probe(doc)


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["25/1", "0/0", "-1/0", "1/0", "N/A", "1e309", "nan"]),
)
_stream = st.dictionaries(
    st.sampled_from(
        ["index", "codec_type", "codec_name", "width", "height", "duration", "avg_frame_rate", "r_frame_rate"]
    ),
    _scalars,
    max_size=8,
)
_doc = st.fixed_dictionaries(
    {
        "format": st.one_of(st.dictionaries(st.sampled_from(["format_name", "duration"]), _scalars), _scalars),
        "streams": st.one_of(st.lists(st.one_of(_stream, _scalars), max_size=6), _scalars),
    }
)


@settings(max_examples=300, deadline=None)
@given(_doc, st.sampled_from(["video", "image"]))
def test_hostile_probe_output_never_crashes_or_passes_out_of_policy(doc: dict[str, Any], family: str) -> None:
    try:
        result = parse_probe(doc)
    except ProbeError:
        return
    if check_policy(result, family, LIMITS) is None:
        video = result.video
        assert video is not None and video.width and video.height
        assert 0 < video.width * video.height <= LIMITS.max_pixels
        assert len(result.streams) <= LIMITS.max_streams
        if family == "video":
            assert video.frame_rate is not None and LIMITS.min_fps <= video.frame_rate <= LIMITS.max_fps
            assert result.duration_s is not None and 0 < result.duration_s <= LIMITS.max_duration_s


def test_argv_is_hardened_and_never_a_shell_string(tmp_path: Path) -> None:
    argv = ffprobe_argv(tmp_path / "in put;rm -rf ~", "video", LIMITS)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    joined = " ".join(argv)
    assert argv[argv.index("-protocol_whitelist") + 1] == "file"
    assert argv[argv.index("-format_whitelist") + 1] == "mov,mp4,matroska,webm"
    assert argv[argv.index("-max_pixels") + 1] == "8294400"
    assert "-codec_whitelist" in argv and "-max_streams" in argv
    assert argv[-1] == f"file:{(tmp_path / 'in put;rm -rf ~').resolve()}"  # one argument, file protocol only
    assert "http" not in joined
    image = ffprobe_argv(tmp_path / "x", "image", LIMITS)
    assert image[image.index("-format_whitelist") + 1] == "png_pipe,jpeg_pipe,webp_pipe"
    with pytest.raises(ValueError):
        ffprobe_argv(tmp_path / "x", "audio", LIMITS)


# --- magic numbers ---------------------------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + b"\x00" * 64
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 64
WEBP = b"RIFF\x24\x00\x00\x00WEBPVP8 " + b"\x00" * 64
MP4 = b"\x00\x00\x00\x20ftypisom\x00\x00\x02\x00isomiso2avc1mp41" + b"\x00" * 64
MOV = b"\x00\x00\x00\x14ftypqt  \x00\x00\x02\x00qt  " + b"\x00" * 64
WEBM = (
    b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01\x42\xf7\x81\x01\x42\xf2\x81\x04\x42\xf3\x81\x08\x42\x82\x84webm"
    + b"\x00" * 32
)


@pytest.mark.parametrize(
    ("head", "declared"),
    [
        (PNG, "image/png"),
        (JPEG, "image/jpeg"),
        (WEBP, "image/webp"),
        (MP4, "video/mp4"),
        (MOV, "video/quicktime"),
        (WEBM, "video/webm"),
        (MOV, "video/mp4"),
        (JPEG, "image/png"),  # same family: ffprobe decides the rest
    ],
)
def test_sniff_accepts_matching_family(head: bytes, declared: str) -> None:
    found, reason = sniff.check_declared(head, declared)
    assert reason is None and found.family == declared.split("/")[0]


@pytest.mark.parametrize(
    ("head", "declared", "expected"),
    [
        (b"#EXTM3U\n#EXTINF:10,\nhttp://127.0.0.1/x.ts\n", "video/mp4", "HLS playlist"),
        (b"\xef\xbb\xbf  #extm3u\n", "video/mp4", "HLS playlist"),
        (b"ffconcat version 1.0\nfile /etc/passwd\n", "video/mp4", "ffconcat"),
        (b"file '/etc/passwd'\n", "video/mp4", "concat list"),
        (b"<html><script>alert(1)</script>", "video/mp4", "HTML"),
        (b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/png", "SVG"),
        (b"<?xml version='1.0'?><svg/>", "image/webp", "XML"),
        (b"hello world", "video/mp4", "unrecognised"),
        (b"", "video/mp4", "empty"),
        (PNG, "video/mp4", "image/png, not video/mp4"),
        (MP4, "image/png", "video/mp4, not image/png"),
        (b"GIF89a" + b"\x00" * 32, "image/png", "image/gif"),
        (b"PK\x03\x04" + b"\x00" * 64, "video/mp4", "not video/mp4"),
    ],
)
def test_sniff_rejects_disguised_content(head: bytes, declared: str, expected: str) -> None:
    _, reason = sniff.check_declared(head, declared)
    assert reason is not None and expected in reason
