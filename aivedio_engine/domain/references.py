"""What one model of one vendor accepts as input, and the pure checks a request is held to before anything is
reserved.

Each adapter declares a `ModelLimits` per model (its vendor's documented facts, or a conservative value it says
is one); the catalog carries them, `POST /v1/generations` checks a request against them before the reservation,
and the adapter checks them again before it sends (a request the vendor would refuse costs nothing to refuse
here). Every failure names the limit, the model and what was asked, so the client can fix the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MB = 1024 * 1024

#: the aspect ratios a request may name (each vendor adapter maps them onto its own spelling)
ASPECT_RATIOS = ("16:9", "9:16", "1:1", "4:3", "3:4", "21:9")


class LimitExceeded(ValueError):
    """A request breaks a model's limit; `field` names the request field for the 422 problem."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """One model's input limits. The defaults are the most conservative shape: one image, no video."""

    max_reference_images: int = 1
    max_reference_videos: int = 0
    #: at least this many reference videos (a video-to-video-only model needs its source clip)
    min_reference_videos: int = 0
    max_image_bytes: int = 10 * MB
    max_video_bytes: int = 0
    #: aspect ratios (of ASPECT_RATIOS) the model can render
    aspect_ratios: tuple[str, ...] = ASPECT_RATIOS
    #: the durations the vendor accepts, in seconds; None = any whole second up to the model's maximum
    durations: tuple[int, ...] | None = None
    #: accepted width/height of a reference image (e.g. Kling 1:2.5 … 2.5:1); None = not limited
    image_ratio_range: tuple[float, float] | None = None
    #: outputs (variants) the adapter can make for one request; the catalog caps the configured max_outputs here
    max_outputs: int = 1

    def allowed_durations(self, max_duration_s: int) -> tuple[int, ...] | None:
        """The vendor's durations that the configured maximum also allows."""
        if self.durations is None:
            return None
        return tuple(d for d in self.durations if d <= max_duration_s)

    def describe(self, max_duration_s: int) -> dict[str, object]:
        allowed = self.allowed_durations(max_duration_s)
        return {
            "max_reference_images": self.max_reference_images,
            "max_reference_videos": self.max_reference_videos,
            "min_reference_videos": self.min_reference_videos,
            "max_image_bytes": self.max_image_bytes,
            "max_video_bytes": self.max_video_bytes,
            "durations_s": list(allowed) if allowed is not None else None,
            "reference_image_ratio": list(self.image_ratio_range) if self.image_ratio_range else None,
        }


@dataclass(frozen=True, slots=True)
class Reference:
    """One input asset as the checks see it: what it is and what its upload validation measured."""

    asset_id: str
    is_video: bool
    size_bytes: int | None = None
    width: int | None = None
    height: int | None = None


def default_duration(limits: ModelLimits, max_duration_s: int, preferred: int = 5) -> int:
    """The duration a request without one gets: `preferred` when allowed, else the nearest allowed below it, else
    the shortest allowed."""
    allowed = limits.allowed_durations(max_duration_s)
    if allowed is None:
        return min(preferred, max_duration_s)
    if not allowed:
        return max_duration_s  # nothing fits the configured maximum: check_shape names the conflict
    below = [d for d in allowed if d <= preferred]
    return max(below) if below else min(allowed)


def check_shape(model: str, limits: ModelLimits, max_duration_s: int, duration_s: int, aspect_ratio: str) -> None:
    """Duration and aspect ratio against the model's sets. Raises LimitExceeded."""
    allowed = limits.allowed_durations(max_duration_s)
    if allowed is not None and duration_s not in allowed:
        listed = ", ".join(str(d) for d in allowed) or "none within the configured maximum"
        raise LimitExceeded("duration_s", f"duration {duration_s} s not allowed for {model} (allowed: {listed})")
    if aspect_ratio not in limits.aspect_ratios:
        raise LimitExceeded(
            "aspect_ratio",
            f"aspect ratio {aspect_ratio} not allowed for {model} (allowed: {', '.join(limits.aspect_ratios)})",
        )


def check_counts(model: str, limits: ModelLimits, images: int, videos: int) -> None:
    """How many references of each kind the model takes. Raises LimitExceeded."""
    if images > limits.max_reference_images:
        raise LimitExceeded(
            "asset_ids",
            f"model {model} accepts {_at_most(limits.max_reference_images, 'reference image')} (got {images})",
        )
    if videos > limits.max_reference_videos:
        raise LimitExceeded(
            "asset_ids",
            f"model {model} accepts {_at_most(limits.max_reference_videos, 'reference video')} (got {videos})",
        )
    if videos < limits.min_reference_videos:
        raise LimitExceeded(
            "asset_ids",
            f"model {model} needs at least {limits.min_reference_videos} reference video(s) (got {videos})",
        )


def check_references(model: str, limits: ModelLimits, refs: Sequence[Reference]) -> None:
    """Counts, then each reference's size and (images) shape. Sizes or dimensions the upload validation did not
    record are not guessed at: the vendor is the judge of those. Raises LimitExceeded."""
    check_counts(model, limits, sum(not r.is_video for r in refs), sum(r.is_video for r in refs))
    for ref in refs:
        kind = "reference video" if ref.is_video else "reference image"
        cap = limits.max_video_bytes if ref.is_video else limits.max_image_bytes
        if ref.size_bytes is not None and ref.size_bytes > cap:
            raise LimitExceeded(
                "asset_ids",
                f"{kind} {ref.asset_id} is {_mb(ref.size_bytes)}; model {model} accepts at most {_mb(cap)} per {kind}",
            )
        if ref.is_video or limits.image_ratio_range is None or not ref.width or not ref.height:
            continue
        lo, hi = limits.image_ratio_range
        ratio = ref.width / ref.height
        if not lo <= ratio <= hi:
            raise LimitExceeded(
                "asset_ids",
                f"reference image {ref.asset_id} is {ref.width}x{ref.height} (width/height {ratio:.2f}); "
                f"model {model} accepts {lo:g} to {hi:g}",
            )


def _at_most(n: int, noun: str) -> str:
    if n == 0:
        return f"no {noun}"
    return f"at most {n} {noun}{'' if n == 1 else 's'}"


def _mb(n: int) -> str:
    return f"{n} bytes" if n < MB else f"{n / MB:.1f} MB ({n} bytes)"
