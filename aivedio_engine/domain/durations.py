"""The one way a person writes a duration: `90` or `90s`, `10m`, `1.5h`, `2d`, `1w` (a number, then an optional unit).

Every duration an operator types (CLI options, filters of the services) goes through `parse_seconds`, so
`--grace 1h` means the same thing in every command. Standard library only.
"""

from __future__ import annotations

import math
import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

#: what to tell someone whose duration was not understood
HINT = "use e.g. 90s, 10m, 1h or 2d; a bare number is seconds"


def parse_seconds(text: str) -> float:
    """`"90"`, `"90s"`, `"10m"`, `"1h"`, `"2d"` → seconds; ValueError naming what is accepted."""
    match = _DURATION.match(text or "")
    if not match:
        raise ValueError(f"not a duration: {text!r} ({HINT})")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2).lower()]
    if not math.isfinite(seconds):
        raise ValueError(f"not a duration: {text!r} (too large)")
    return seconds


def format_seconds(seconds: float) -> str:
    """The shortest exact way to write `seconds` back: 3600 → "1h", 90 → "90s", 0.5 → "0.5s"."""
    for unit in ("d", "h", "m"):
        if seconds and seconds % _UNIT_S[unit] == 0:
            return f"{seconds / _UNIT_S[unit]:g}{unit}"
    return f"{seconds:g}s"
