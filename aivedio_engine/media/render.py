"""Pure argv builders for the `local` provider's renders: a short H.264/AAC clip made from a
reference image (slow pan/zoom) or a generated background, with the prompt as a caption and a sine tone.

Nothing here runs a process. The caller writes the caption to a file and passes its path: the prompt is user
input and never enters the filtergraph, so no quote, colon, bracket or `%{...}` in it can change the graph
(drawtext also gets `expansion=none`, so `%{...}` prints literally instead of being evaluated). Inputs are
local files read through `file:` with `-protocol_whitelist file` and an image-only demuxer/decoder whitelist;
everything else comes from lavfi sources whose parameters are numbers we computed.

The same spec (seed included) gives byte-identical output: the seed picks the background and its
parameters, the pan direction and the tone; bitexact flags keep encoder/version strings out of the file.

This module makes every choice (sizes, seeded background and motion, fades, tone); `ffgraph`, the one module
allowed to import ffmpeg-python, spells those choices as a filtergraph and compiles the argv (the caller runs
the subprocess).
"""

from __future__ import annotations

import hashlib
import math
import random
import textwrap
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from aivedio_engine.media import ffgraph

#: short side in pixels, by resolution name ("p" counts the short side, so 9:16 720p is 720x1280)
RESOLUTIONS = {"360p": 360, "480p": 480, "720p": 720, "1080p": 1080}
#: aspect ratios beyond this (either way) are refused: a 360x8000 strip is a mistake, not a video
MAX_ASPECT = Fraction(4)
BACKGROUNDS = ("testsrc2", "gradients", "mandelbrot")
IMAGE_DEMUXERS = "png_pipe,jpeg_pipe,webp_pipe"
IMAGE_DECODERS = "png,mjpeg,webp"
#: reference images bigger than 8K are refused by the decoder before it allocates (decompression bombs)
MAX_IMAGE_PIXELS = 7680 * 4320
#: where Debian (fonts-dejavu-core), Fedora and Alpine put a plain sans font; first existing wins
FONT_CANDIDATES = (
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
)
#: fonts with CJK glyphs, preferred for captions that need them (DejaVu would draw boxes)
CJK_FONT_CANDIDATES = (
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/noto-cjk/NotoSansCJK-Regular.ttc",
)
MAX_CAPTION_LINES = 4
#: points on the set's boundary, where zooming in stays interesting
MANDELBROT_SPOTS = (
    (-0.743643887, 0.131825904),
    (-0.10109636, 0.95628651),
    (-0.77568377, 0.13646737),
    (0.001643721, -0.822467633),
)


class RenderSpecError(ValueError):
    """The request cannot be rendered as asked (unknown resolution, malformed aspect ratio, bad duration)."""


@dataclass(frozen=True, slots=True)
class ClipSpec:
    width: int
    height: int
    duration_s: float
    seed: int
    fps: int = 15
    #: the embedded demo favours turnaround over bitrate: veryfast took twice as long for little visible gain
    preset: str = "ultrafast"
    threads: int = 2
    #: read the audio source at its native rate, so a render takes as long as the clip (progress demos, tests)
    realtime: bool = False
    #: which output of a multi-output request (`n`): 0 is the request's own clip; each other index re-seeds the
    #: choices (background, colours, pan/zoom direction) so the variants visibly differ
    variant: int = 0

    @property
    def frames(self) -> int:
        return max(1, round(self.duration_s * self.fps))


def frame_size(resolution: str, aspect_ratio: str) -> tuple[int, int]:
    """(width, height): the resolution fixes the short side, the aspect ratio the long one; both even."""
    short = RESOLUTIONS.get(resolution.strip().lower())
    if short is None:
        raise RenderSpecError(f"unsupported resolution {resolution!r} (known: {', '.join(RESOLUTIONS)})")
    ratio = parse_aspect(aspect_ratio)
    if ratio >= 1:
        return _even(short * ratio), short
    return short, _even(short / ratio)


def parse_aspect(aspect_ratio: str) -> Fraction:
    num, sep, den = aspect_ratio.strip().partition(":")
    if not sep or not num.isdigit() or not den.isdigit() or len(num) > 4 or len(den) > 4:
        raise RenderSpecError(f"aspect ratio {aspect_ratio!r} is not W:H")
    if int(num) == 0 or int(den) == 0:
        raise RenderSpecError(f"aspect ratio {aspect_ratio!r} has a zero side")
    ratio = Fraction(int(num), int(den))
    if not 1 / MAX_ASPECT <= ratio <= MAX_ASPECT:
        raise RenderSpecError(f"aspect ratio {aspect_ratio!r} is more extreme than {MAX_ASPECT}:1")
    return ratio


def _even(value: Fraction | float) -> int:
    # yuv420p and libx264 need even sides; round to the nearest even number, never below 2
    return max(2, 2 * math.floor(float(value) / 2 + 0.5))


def make_spec(resolution: str, aspect_ratio: str, duration_s: float, seed: int, **options: Any) -> ClipSpec:
    if not math.isfinite(duration_s) or not 0 < duration_s <= 600:
        raise RenderSpecError(f"duration {duration_s!r}s is outside (0, 600]")
    width, height = frame_size(resolution, aspect_ratio)
    return ClipSpec(width=width, height=height, duration_s=float(duration_s), seed=seed, **options)


def seed_from(text: str) -> int:
    """A stable 31-bit seed for requests that bring none (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "replace")).digest()[:4], "big") & 0x7FFFFFFF


def pick_font(paths: tuple[str, ...] = FONT_CANDIDATES) -> Path | None:
    """The first font file that exists, or None: then captions are skipped rather than failing the render."""
    for candidate in paths:
        path = Path(candidate)
        if path.is_file():
            return path
    return None


def needs_cjk(text: str) -> bool:
    return any(
        0x2E80 <= ord(c) <= 0x9FFF
        or 0xAC00 <= ord(c) <= 0xD7AF
        or 0xF900 <= ord(c) <= 0xFAFF
        or 0xFF00 <= ord(c) <= 0xFFEF
        for c in text
    )


def caption_text(prompt: str, width: int, height: int) -> str:
    """What goes into the caption file: printable characters only, wrapped to the frame, at most 4 lines."""
    unified = prompt.replace("\r\n", "\n").replace("\r", "\n")
    cleaned = "".join(c if c == "\n" or c.isprintable() else " " for c in unified)
    per_line = max(8, int(width / (font_size(height) * (1.1 if needs_cjk(cleaned) else 0.6))))
    lines: list[str] = []
    for paragraph in cleaned.split("\n"):
        lines.extend(textwrap.wrap(paragraph, per_line, break_long_words=True) or ([""] if lines else []))
    while lines and not lines[-1].strip():
        lines.pop()
    if len(lines) > MAX_CAPTION_LINES:
        lines = lines[:MAX_CAPTION_LINES]
        lines[-1] = lines[-1][: per_line - 1].rstrip() + "…"
    return "\n".join(lines)


def font_size(height: int) -> int:
    return max(12, height // 18)


def clip_argv(
    spec: ClipSpec,
    output: Path,
    *,
    image: Path | None = None,
    caption_file: Path | None = None,
    font_file: Path | None = None,
    ffmpeg_bin: str = "ffmpeg",
) -> list[str]:
    """The ffmpeg argv (a list, never a shell string) that renders `spec` into `output` (MP4).

    Progress goes to stdout as `-progress` key=value lines; errors only to stderr.
    """
    # a string seed is hashed deterministically (not salted per process); variant 0 keeps the plain seed
    rng = random.Random(spec.seed if spec.variant == 0 else f"{spec.seed}/{spec.variant}")
    video = _image_video(spec, image, rng) if image is not None else _generated_video(spec, rng)
    caption = None
    if caption_file is not None and font_file is not None:
        caption = ffgraph.Caption(font_file=str(font_file), text_file=str(caption_file), size=font_size(spec.height))
    audio = _tone(spec, rng)
    head = [ffmpeg_bin, "-nostdin", "-hide_banner", "-nostats", "-loglevel", "error", "-progress", "pipe:1"]
    return ffgraph.clip_argv(
        head,
        f"file:{output}",
        video,
        audio,
        caption=caption,
        duration_s=spec.duration_s,
        fade_s=min(0.5, spec.duration_s / 4),
        fps=spec.fps,
        preset=spec.preset,
        threads=spec.threads,
    )


def _image_video(spec: ClipSpec, image: Path, rng: random.Random) -> ffgraph.PannedImage:
    n = spec.frames
    source = ffgraph.Input(
        f"file:{image}",
        {
            "protocol_whitelist": "file",
            "format_whitelist": IMAGE_DEMUXERS,
            "codec_whitelist": IMAGE_DECODERS,
            "max_pixels": MAX_IMAGE_PIXELS,
        },
    )
    # odd variants zoom the other way, so two variants never share a direction by chance
    zoom_in = (rng.random() < 0.5) != (spec.variant % 2 == 1)
    depth = round(rng.uniform(0.12, 0.3), 3)
    z = f"1+{depth}*on/{n}" if zoom_in else f"{1 + depth}-{depth}*on/{n}"
    fx, fy = rng.choice(((0, 0.5), (1, 0.5), (0.5, 0), (0.5, 1), (0.5, 0.5)))
    x = _pan("iw-iw/zoom", fx, n, rng.random() < 0.5)
    y = _pan("ih-ih/zoom", fy, n, rng.random() < 0.5)
    return ffgraph.PannedImage(source, width=spec.width, height=spec.height, frames=n, fps=spec.fps, zoom=z, x=x, y=y)


def _pan(span: str, anchor: float, frames: int, forward: bool) -> str:
    if anchor != 0.5:
        return f"({span})*{anchor}"
    progress = f"on/{frames}" if forward else f"(1-on/{frames})"
    return f"({span})*{progress}"


def _generated_video(spec: ClipSpec, rng: random.Random) -> ffgraph.Generated:
    w, h, fps, d = spec.width, spec.height, spec.fps, f"{spec.duration_s:.3f}"
    kind = BACKGROUNDS[rng.randrange(len(BACKGROUNDS))]
    if spec.variant:  # testsrc2 ignores the seed: two variants drawing it would be the same picture
        kind = BACKGROUNDS[1 + spec.variant % 2]
    if kind == "testsrc2":
        return ffgraph.Generated(f"testsrc2=size={w}x{h}:rate={fps}:duration={d}")
    # both generators cost per pixel (720p gradients alone took 5 s for a 10 s clip, mandelbrot more); they
    # are smooth or abstract, so drawing them small and scaling up loses little
    if kind == "gradients":
        colors = ":".join(f"c{i}=0x{rng.randrange(0x1000000):06x}" for i in range(4))
        graph = (
            f"gradients=size={_even(w / 2)}x{_even(h / 2)}:rate={fps}:duration={d}:nb_colors=4:{colors}"
            f":seed={rng.randrange(1 << 31)}:speed={rng.uniform(0.005, 0.03):.4f}"
        )
        return ffgraph.Generated(graph, scale_to=(w, h))
    start_x, start_y = rng.choice(MANDELBROT_SPOTS)
    # end_pts counts frames, not seconds: the zoom reaches end_scale on the last frame and no further
    graph = (
        f"mandelbrot=size={_even(w / 4)}x{_even(h / 4)}:rate={fps}:maxiter=40:start_x={start_x}"
        f":start_y={start_y}:start_scale=3:end_scale={rng.uniform(0.02, 0.2):.3f}:end_pts={spec.frames}"
    )
    return ffgraph.Generated(graph, scale_to=(w, h), scale_flags="bicubic")


def _tone(spec: ClipSpec, rng: random.Random) -> ffgraph.Tone:
    frequency = rng.choice((220, 262, 294, 330, 392, 440, 494, 523))
    return ffgraph.Tone(
        frequency, spec.duration_s, fade_s=min(0.3, spec.duration_s / 4), volume=0.2, realtime=spec.realtime
    )


# --- running aids (still pure: the caller owns the process) ----------------------------------------------


def progress_percent(line: bytes, duration_s: float) -> int | None:
    """0–99 from one `-progress` line (`out_time_us=...`); 100 is for the caller to set on success."""
    key, _, value = line.decode("ascii", "replace").strip().partition("=")
    if key != "out_time_us" or not value.isdigit():
        return None  # other keys, and "N/A" before the first frame is out
    return min(99, int(int(value) / (duration_s * 10_000)))


def error_summary(stderr: bytes, hide: tuple[Path | None, ...] = ()) -> str:
    """ffmpeg's first error line, printable, with our local paths replaced by 'input'."""
    for line in stderr.decode("utf-8", "replace").splitlines():
        for path in hide:
            line = line.replace(f"file:{path}", "input").replace(str(path), "input") if path else line
        if line := line.strip():
            return "".join(c if c.isprintable() else "?" for c in line)[:200]
    return ""
