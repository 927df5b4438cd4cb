"""The local provider's ffmpeg argv builder, checked without running ffmpeg: list-only argv, the prompt kept out
of the filtergraph, local-file-only inputs, size and aspect arithmetic, and seeding."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import pytest

from aivedio_engine.media import render, sandbox
from aivedio_engine.media.render import RenderSpecError, caption_text, clip_argv, frame_size, make_spec

HOSTILE = "INJ'ECT\"ED: [x];[y] drawtext=text=%{eif\\:1/0\\:d}, movie=/etc/passwd,\nZQXJ\\line %{pts}"


def _argv(tmp_path: Path, seed: int = 1, image: Path | None = None, **options: object) -> list[str]:
    spec = make_spec("360p", "16:9", 2, seed, **options)
    caption = tmp_path / "caption.txt"
    caption.write_text(caption_text(HOSTILE, spec.width, spec.height), encoding="utf-8")
    return clip_argv(spec, tmp_path / "out.mp4", image=image, caption_file=caption, font_file=Path("/fonts/Sans.ttf"))


def _after(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


@pytest.mark.parametrize(
    ("resolution", "aspect", "size"),
    [
        ("360p", "16:9", (640, 360)),
        ("720p", "16:9", (1280, 720)),
        ("720p", "9:16", (720, 1280)),
        ("360p", "9:16", (360, 640)),
        ("360p", "1:1", (360, 360)),
        ("720p", "4:3", (960, 720)),
        ("360p", "3:4", (360, 480)),
        ("720p", "21:9", (1680, 720)),
        ("480p", "16:10", (768, 480)),
        (" 720P ", " 16:9 ", (1280, 720)),
    ],
)
def test_frame_size(resolution: str, aspect: str, size: tuple[int, int]) -> None:
    assert frame_size(resolution, aspect) == size


def test_every_reasonable_aspect_gives_even_sides_close_to_the_ratio() -> None:
    for a in range(1, 33):
        for b in range(1, 33):
            if not Fraction(1, 4) <= Fraction(a, b) <= 4:
                continue
            for resolution, short in render.RESOLUTIONS.items():
                w, h = frame_size(resolution, f"{a}:{b}")
                assert w % 2 == 0 and h % 2 == 0 and min(w, h) == short
                assert abs(w / h - a / b) <= 2 / short + 1e-9, (a, b, resolution, w, h)


@pytest.mark.parametrize(
    "aspect", ["16/9", "16:", ":9", "0:9", "16:0", "-16:9", "16:9:1", "a:b", "100:1", "1:5", "99999:1", "", "1.5:1"]
)
def test_bad_aspect_ratios_are_refused(aspect: str) -> None:
    with pytest.raises(RenderSpecError):
        frame_size("360p", aspect)


@pytest.mark.parametrize("resolution", ["4k", "2160p", "361p", "", "720"])
def test_unknown_resolutions_are_refused(resolution: str) -> None:
    with pytest.raises(RenderSpecError):
        frame_size(resolution, "16:9")


@pytest.mark.parametrize("duration", [0, -1, 601, float("nan"), float("inf")])
def test_bad_durations_are_refused(duration: float) -> None:
    with pytest.raises(RenderSpecError):
        make_spec("360p", "16:9", duration, 1)


def test_argv_is_a_list_of_plain_strings_with_the_hardening_flags(tmp_path: Path) -> None:
    argv = _argv(tmp_path)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    assert argv[0] == "ffmpeg" and "-c" not in argv[:2] and not any(a in ("sh", "bash", "/bin/sh") for a in argv)
    for flag in ("-nostdin", "-y", "-hide_banner"):
        assert flag in argv
    assert _after(argv, "-progress") == ["pipe:1"]
    assert argv[-2] == f"file:{tmp_path / 'out.mp4'}"  # the output, then the trailing -y
    assert _after(argv, "-vcodec") == ["libx264"] and _after(argv, "-acodec") == ["aac"]
    assert _after(argv, "-movflags") == ["+faststart"] and _after(argv, "-f")[-1] == "mp4"
    assert _after(argv, "-pix_fmt") == ["yuv420p"] and _after(argv, "-t") == ["2.000"]
    assert _after(argv, "-r") == ["15"] and _after(argv, "-map_metadata") == ["-1"]
    assert _after(argv, "-fflags") == ["+bitexact"]


def test_the_prompt_never_enters_the_argv(tmp_path: Path) -> None:
    for seed in range(6):
        for image in (None, tmp_path / "ref.png"):
            argv = _argv(tmp_path, seed, image)
            joined = "\n".join(argv)
            for fragment in ("INJ", "ECT", "passwd", "eif", "ZQXJ", "%{", "[x]", "[y]", "movie"):
                assert fragment not in joined, (fragment, argv)
            graph = _after(argv, "-filter_complex")[0]
            drawtext = next(part for part in graph.split(";") if "drawtext=" in part)
            assert "expansion=none" in drawtext and f"textfile={tmp_path}/caption.txt" in drawtext
            assert ":text=" not in drawtext and "=text=" not in drawtext


def test_caption_file_holds_the_prompt_cleaned_and_wrapped() -> None:
    text = caption_text("a\tb\x00c\x1b[31m\r\nsecond line\u2028x" + " word" * 200, 640, 360)
    lines = text.split("\n")
    assert lines[0] == "a b c [31m" and lines[1].startswith("second line x word")
    assert len(lines) == render.MAX_CAPTION_LINES and lines[-1].endswith("…")
    assert all(c == "\n" or c.isprintable() for c in text)
    assert max(len(line) for line in lines) <= 640 // int(render.font_size(360) * 0.6)
    assert caption_text("x" * 500, 640, 360).count("\n") == render.MAX_CAPTION_LINES - 1  # long words break
    assert caption_text("\n\n  \n", 640, 360).strip() == ""


def test_no_font_or_no_caption_means_no_drawtext(tmp_path: Path) -> None:
    spec = make_spec("360p", "16:9", 2, 1)
    for caption, font in ((tmp_path / "c.txt", None), (None, Path("/f.ttf")), (None, None)):
        argv = clip_argv(spec, tmp_path / "o.mp4", caption_file=caption, font_file=font)
        assert "drawtext" not in _after(argv, "-filter_complex")[0]


def test_reference_image_is_read_as_a_local_file_with_image_demuxers_only(tmp_path: Path) -> None:
    image = tmp_path / "weird name, with: [chars]%d.png"
    argv = _argv(tmp_path, image=image)
    i = argv.index(f"file:{image}")
    assert argv[i - 1] == "-i"
    head = argv[:i]
    assert _after(head, "-protocol_whitelist") == ["file"]
    assert _after(head, "-format_whitelist") == [render.IMAGE_DEMUXERS]  # never image2 (%d patterns), concat, hls
    assert _after(head, "-codec_whitelist") == [render.IMAGE_DECODERS]
    assert _after(head, "-max_pixels") == [str(render.MAX_IMAGE_PIXELS)]
    graph = _after(argv, "-filter_complex")[0]
    assert "zoompan=" in graph and "s=640x360" in graph and "d=30" in graph
    assert "file:" not in graph and str(image) not in graph


def test_generated_backgrounds_are_lavfi_sources_with_numeric_parameters(tmp_path: Path) -> None:
    seen = set()
    for seed in range(40):
        argv = _argv(tmp_path, seed)
        sources = [argv[i + 1] for i, a in enumerate(argv) if a == "-i"]
        assert _after(argv, "-f")[:2] == ["lavfi", "lavfi"] and len(sources) == 2
        for source in sources:
            name, _, params = source.partition("=")
            assert re.fullmatch(r"[a-z0-9]+", name)
            for param in params.split(":"):
                assert re.fullmatch(r"[a-z_0-9]+=-?[0-9.xa-f]+", param), source
        seen.add(sources[0].partition("=")[0])
    assert seen == set(render.BACKGROUNDS)


def test_same_seed_same_argv_different_seeds_vary(tmp_path: Path) -> None:
    assert _argv(tmp_path, 7) == _argv(tmp_path, 7)
    image = tmp_path / "ref.png"
    assert len({tuple(_argv(tmp_path, s)) for s in range(10)}) > 5
    assert len({tuple(_argv(tmp_path, s, image)) for s in range(10)}) > 3
    assert render.seed_from("a prompt") == render.seed_from("a prompt") != render.seed_from("another")


def test_realtime_throttles_the_tone_input(tmp_path: Path) -> None:
    assert "-re" not in _argv(tmp_path)
    argv = _argv(tmp_path, realtime=True)
    i = argv.index("-re")
    assert argv[i + 1 : i + 3][0] == "-i" and argv[i + 2].startswith("sine=")


def test_filter_values_with_graph_syntax_are_escaped(tmp_path: Path) -> None:
    """Our own paths may contain filtergraph syntax (a data dir named by the operator): parsing the graph the
    way libavfilter does must give back the exact paths."""
    spec = make_spec("360p", "16:9", 2, 1)
    odd = tmp_path / "d: it's [a],b;c=\\x"
    argv = clip_argv(spec, tmp_path / "o.mp4", caption_file=odd / "c.txt", font_file=odd / "f.ttf")
    filters = _parse_graph(_after(argv, "-filter_complex")[0])
    assert [name for name, _ in filters] == ["format", "fade", "fade", "drawtext", "volume", "afade", "afade"]
    drawtext = dict(filters[3][1])
    assert drawtext["textfile"] == str(odd / "c.txt") and drawtext["fontfile"] == str(odd / "f.ttf")
    assert drawtext["expansion"] == "none"


def _token(text: str, i: int, terms: str) -> tuple[str, int]:
    """libavutil's av_get_token: backslash escapes one character, '...' quotes, stops at a terminator."""
    out = []
    while i < len(text) and text[i] not in terms:
        if text[i] == "\\" and i + 1 < len(text):
            out.append(text[i + 1])
            i += 2
        elif text[i] == "'":
            end = text.index("'", i + 1)
            out.append(text[i + 1 : end])
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out), i


def _parse_graph(graph: str) -> list[tuple[str, list[tuple[str, str]]]]:
    filters = []
    i = 0
    while i < len(graph):
        while i < len(graph) and graph[i] == "[":  # input pad labels
            i = graph.index("]", i) + 1
        spec, i = _token(graph, i, "[],;")
        while i < len(graph) and graph[i] == "[":  # output pad labels
            i = graph.index("]", i) + 1
        i += 1  # the ',' or ';' separator
        name, _, args = spec.partition("=")
        options, j = [], 0
        while j < len(args):
            key, j = _token(args, j, "=:")
            value, j = _token(args, j + 1, ":")
            options.append((key, value))
            j += 1
        filters.append((name, options))
    return filters


def test_progress_lines_become_percentages() -> None:
    assert render.progress_percent(b"out_time_us=1000000\n", 2.0) == 50
    assert render.progress_percent(b"out_time_us=9000000\n", 2.0) == 99  # 100 only once the file is complete
    assert render.progress_percent(b"out_time_us=N/A\n", 2.0) is None
    assert render.progress_percent(b"progress=continue\n", 2.0) is None
    assert render.progress_percent(b"\xff\xfe garbage", 2.0) is None


def test_error_summary_is_one_printable_line_without_our_paths(tmp_path: Path) -> None:
    image = tmp_path / "ref.png"
    stderr = f"\n  file:{image}: Invalid data found\x1b[0m\nsecond line\n".encode()
    summary = render.error_summary(stderr, (tmp_path / "work", image))
    assert summary == "input: Invalid data found?[0m" and str(tmp_path) not in summary
    assert render.error_summary(b"x" * 1000) == "x" * 200 and render.error_summary(b"\n \n") == ""


def test_sandbox_prefix_sets_a_soft_cpu_limit_below_the_hard_one() -> None:
    prefix = sandbox.prefix(sandbox.encoder_cpu_s(60), 2 * 1024**3, prlimit="/usr/bin/prlimit")
    assert prefix[0] == "/usr/bin/prlimit" and prefix[-1] == "--"
    # SIGXCPU at 241 s of CPU, SIGKILL only a second later: a CPU bomb reads as such, not as the OOM killer
    assert "--cpu=241:242" in prefix and "--nofile=256" in prefix and f"--as={2 * 1024**3}" in prefix
    assert sandbox.signal_reason(-9) == "killed by SIGKILL" and sandbox.signal_reason(-200) == "killed by signal 200"
