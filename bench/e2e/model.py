"""What one task is and needs: the request, the statuses, the targets, and the physical steps between its 202 and
the GET that sees SUCCEEDED (the count-based baseline). Pure: nothing here times anything."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

#: targets of the earlier issue (ratios to the count-based baseline) and of issue 12 (absolute ms, tasks/s)
TARGET_P50_X, TARGET_P99_X, FLOOR_P50_X, IDLE_P99_MS = 8.0, 30.0, 15.0, 150.0
IDLE_P50_TARGET_MS, IDLE_P99_TARGET_MS = 150.0, 300.0
SATURATION_TARGET = 12.0
#: p99 overhead at 50 % of saturation ÷ idle p99
HALF_LOAD_P99_X = 2.0
LOAD_RATE = 50.0
INITIAL_CREDITS = Decimal(10) ** 9
MODEL = "sim-v1"
BODY = {"prompt": "a red fox running through fresh snow at dusk, cinematic, 35mm film", "model": MODEL, "duration_s": 2}
TERMINAL = frozenset({"SUCCEEDED", "FAILED_FINAL", "CANCELED", "EXPIRED"})
REQUIRED_OUTPUTS = ("hls", "proxy_mp4", "thumbnail")
#: derivative objects per task expected in the bucket (proxy.mp4, index.m3u8, init.mp4, seg_000.m4s, thumbnail)
EXPECTED_DERIVED_FILES = 5


# ------------------------------------------------------------------------------------- the physical steps
# ------------------------------------------------------------------------------------- the physical steps
@dataclass(frozen=True)
class Stage:
    name: str
    what: str
    commits: int
    hops: int
    http: int
    s3: int
    #: the media stage: left out of the media-excluded baseline
    media: bool = False


def pipeline(derived_files: int = EXPECTED_DERIVED_FILES) -> tuple[Stage, ...]:
    """The physical steps of one task between the 202 and the GET that sees SUCCEEDED (see the module doc)."""
    return (
        Stage("dispatch", "Dispatcher._claim: task → DISPATCHING, attempt, outbox row", 1, 0, 0, 0),
        Stage("submit", "relay claim + Redis hop; SubmitService tx A, POST /v1/jobs to the sim, tx B", 3, 1, 1, 0),
        Stage("callback", "sim's succeeded webhook POST; CallbackService tx", 1, 0, 1, 0),
        Stage("reduce", "relay claim + hop; reducer tx (→ OUTPUT_FETCHING)", 2, 1, 0, 0),
        Stage("fetch", "relay claim + hop; GET output from the sim; S3 HEAD + PUT; tx (→ POST_PROCESSING)", 2, 1, 1, 2),
        Stage(
            "media",
            f"relay claim + hop; S3 GET; ffprobe/ffmpeg; {derived_files} derivative PUTs; tx (→ SUCCEEDED)",
            2,
            1,
            0,
            1 + derived_files,
            media=True,
        ),
        Stage("read", "client GET sees SUCCEEDED", 0, 0, 1, 0),
    )


STEP_KEYS = ("commit", "hop", "http", "s3")


def step_counts(stages: Sequence[Stage], exclude_media: bool = False) -> dict[str, int]:
    """How many of each physical step the stages need."""
    use = [s for s in stages if not (exclude_media and s.media)]
    return {
        "commit": sum(s.commits for s in use),
        "hop": sum(s.hops for s in use),
        "http": sum(s.http for s in use),
        "s3": sum(s.s3 for s in use),
    }


def count_baseline(latency_ms: dict[str, float], counts: dict[str, int]) -> float:
    """Σ count × single-client latency (ms); NaN when a needed latency is missing."""
    total = 0.0
    for key, n in counts.items():
        if n == 0:
            continue
        v = latency_ms.get(key)
        if v is None or not math.isfinite(v):
            return math.nan
        total += n * v
    return total


def anchor_baseline(latency_ms: dict[str, float]) -> float:
    """The anchor baseline: create + single-row claim + 2 × transition + 2 × EVAL, all c=1 (ms)."""
    try:
        return (
            latency_ms["create_task"]
            + latency_ms["claim_outbox_1"]
            + 2 * latency_ms["transition"]
            + 2 * latency_ms["eval"]
        )
    except KeyError:
        return math.nan
