"""The one duration syntax of every CLI option and operator filter."""

from __future__ import annotations

import pytest

from aivedio_engine.domain.durations import format_seconds, parse_seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("10m", 600), ("1h", 3600), ("1.5h", 5400), ("2d", 172_800), ("1w", 604_800)]
    + [(" 5M ", 300)],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-1h", "1h30m", "10 minutes", "1y", "inf"])
def test_refused_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match=r"not a duration: .*90s, 10m, 1h"):
        parse_seconds(text)


@pytest.mark.parametrize(("seconds", "text"), [(900, "15m"), (3600, "1h"), (90, "90s"), (0.5, "0.5s"), (172_800, "2d")])
def test_format_round_trips(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text and parse_seconds(text) == seconds
