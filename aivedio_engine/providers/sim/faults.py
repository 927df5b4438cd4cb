"""Fault specs for the simulator and the seeded dice that decide when a fault fires.

Spec grammar (comma separated, `-` and `_` interchangeable in names):

    ambiguous=0.2,5xx=0.1,429=0.05,throttled=0.1,latency=50ms..200ms,dup_cb=0.3,reorder_cb=0.3,
    drop_cb=0.1,early_cb=0.05,url_expire=1s,redirect=0.2,cancel_too_late=0.5

Every fault kind draws from its own RNG seeded with `(seed, kind)`, so turning one fault on or off does not
shift the sequence of another: a failing chaos run can be replayed with the same seed and a narrower spec.
"""

from __future__ import annotations

import random
import re
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

#: probability faults: each is rolled once per opportunity (per call, per callback event, per output GET).
PROBABILITY_FAULTS: Mapping[str, str] = MappingProxyType(
    {
        "ambiguous": "submit: job created and billed, then the connection is dropped before the response",
        "reset": "submit: connection dropped, no job created (looks identical to `ambiguous` client-side)",
        "5xx": "submit: 500 before accept, no job created",
        "429": "submit: 429 with Retry-After, no job created",
        "throttled": "job: THROTTLED for a while before it runs",
        "fail": "job: ends FAILED instead of SUCCEEDED",
        "dup_cb": "callback: delivered 1-3 extra times with the same webhook-id",
        "reorder_cb": "callback: held back and delivered after the next one",
        "drop_cb": "callback: never delivered",
        "early_cb": "callback: the first callback is delivered before the submit response is sent",
        "redirect": "output GET: 302 to another sim path",
        "cancel_too_late": "cancel: the job finishes first, the cancel answers 409 too_late",
    }
)
#: duration faults: `url_expire` sets the output URL lifetime, `invisible` makes fresh jobs 404 for a while,
#: `retry_after` is the Retry-After sent with 429.
DURATION_FAULTS = ("url_expire", "invisible", "retry_after")
RANGE_FAULTS = ("latency",)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s)?\s*$")


class FaultSpecError(ValueError):
    """The spec names an unknown fault or a value out of range; the message names the offending item."""


@dataclass(frozen=True, slots=True)
class Faults:
    probabilities: Mapping[str, float] = field(default_factory=dict)
    latency_s: tuple[float, float] = (0.0, 0.0)
    url_expire_s: float | None = None
    invisible_s: float = 0.0
    retry_after_s: float = 1.0

    def p(self, name: str) -> float:
        return self.probabilities.get(name, 0.0)

    def to_spec(self) -> str:
        parts = [f"{k}={v:g}" for k, v in sorted(self.probabilities.items()) if v]
        if self.latency_s != (0.0, 0.0):
            lo, hi = self.latency_s
            parts.append(f"latency={_ms(lo)}" if lo == hi else f"latency={_ms(lo)}..{_ms(hi)}")
        if self.url_expire_s is not None:
            parts.append(f"url_expire={_ms(self.url_expire_s)}")
        if self.invisible_s:
            parts.append(f"invisible={_ms(self.invisible_s)}")
        if self.retry_after_s != 1.0:
            parts.append(f"retry_after={_ms(self.retry_after_s)}")
        return ",".join(parts)


NO_FAULTS = Faults()


def parse_faults(spec: str | None) -> Faults:
    if not spec or not spec.strip():
        return NO_FAULTS
    probabilities: dict[str, float] = {}
    values: dict[str, object] = {}
    for item in spec.split(","):
        if not item.strip():
            continue
        name, sep, raw = item.partition("=")
        name = name.strip().lower().replace("-", "_")
        if not sep:
            raise FaultSpecError(f"fault {item.strip()!r}: expected NAME=VALUE")
        if name in PROBABILITY_FAULTS:
            try:
                p = float(raw)
            except ValueError:
                raise FaultSpecError(f"fault {name}: {raw.strip()!r} is not a probability") from None
            if not 0.0 <= p <= 1.0:
                raise FaultSpecError(f"fault {name}: probability {p:g} is outside [0, 1]")
            probabilities[name] = p
        elif name in DURATION_FAULTS:
            values[name] = _duration(name, raw)
        elif name in RANGE_FAULTS:
            lo_raw, dots, hi_raw = raw.partition("..")
            lo = _duration(name, lo_raw)
            hi = _duration(name, hi_raw) if dots else lo
            if hi < lo:
                raise FaultSpecError(f"fault {name}: range {raw.strip()!r} ends before it starts")
            values[name] = (lo, hi)
        else:
            known = ", ".join([*PROBABILITY_FAULTS, *DURATION_FAULTS, *RANGE_FAULTS])
            raise FaultSpecError(f"unknown fault {name!r} (known: {known})")
    return Faults(
        probabilities=MappingProxyType(probabilities),
        latency_s=values.get("latency", (0.0, 0.0)),  # type: ignore[arg-type]
        url_expire_s=values.get("url_expire"),  # type: ignore[arg-type]
        invisible_s=values.get("invisible", 0.0),  # type: ignore[arg-type]
        retry_after_s=values.get("retry_after", 1.0),  # type: ignore[arg-type]
    )


def _duration(name: str, raw: str) -> float:
    m = _DURATION.match(raw)
    if not m:
        raise FaultSpecError(f"fault {name}: {raw.strip()!r} is not a duration (e.g. 200ms, 1.5s)")
    value = float(m.group(1))
    return value / 1000.0 if m.group(2) == "ms" else value


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:g}ms" if seconds < 1 else f"{seconds:g}s"


class Dice:
    """Seeded, thread-safe draws, one independent stream per fault kind; every draw is kept in `history`."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._lock = threading.Lock()
        self._streams: dict[str, random.Random] = {}
        self.history: deque[tuple[str, object]] = deque(maxlen=10_000)

    def _stream(self, name: str) -> random.Random:
        rng = self._streams.get(name)
        if rng is None:
            # str seeds are hashed with SHA-512 by `random`, independent of PYTHONHASHSEED
            rng = self._streams[name] = random.Random(f"{self.seed}:{name}")
        return rng

    def roll(self, name: str, p: float) -> bool:
        """Always draws, even for p in {0, 1}, so a stream's position depends only on how often it was asked."""
        with self._lock:
            hit = self._stream(name).random() < p
            self.history.append((name, hit))
            return hit

    def uniform(self, name: str, lo: float, hi: float) -> float:
        with self._lock:
            value = self._stream(name).uniform(lo, hi)
            self.history.append((name, value))
            return value

    def randint(self, name: str, lo: int, hi: int) -> int:
        with self._lock:
            value = self._stream(name).randint(lo, hi)
            self.history.append((name, value))
            return value

    def token(self, name: str, bits: int = 48) -> int:
        with self._lock:
            return self._stream(name).getrandbits(bits)
