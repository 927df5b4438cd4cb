"""The benchmarks page: how to run each benchmark (from bench/'s registry and each module's DESCRIPTION) and the
latest headline figure of each, read from the committed bench/results/latest.json that `bench/run NAME --record`
writes. The page changes only when a run is recorded or a benchmark is added."""

from __future__ import annotations

import importlib
from typing import Any

from bench import headlines
from bench.__main__ import BENCHMARKS


def _value(x: float | None, unit: str) -> str:
    if x is None:
        return "—"
    if abs(x) >= 100:
        text = f"{x:,.0f}"
    elif abs(x) >= 10:
        text = f"{x:.1f}"
    else:
        text = f"{x:.3g}"
    return f"{text} {unit}".strip() if unit and not unit.startswith("/") else f"{text}{unit}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render() -> str:
    out = ["## How to run each", "", "| benchmark | command | what it measures |", "|---|---|---|"]
    for name, module_name in BENCHMARKS.items():
        description = importlib.import_module(module_name).DESCRIPTION
        out.append(f"| `{name}` | `bench/run {name} --record` | {_cell(description)} |")
    latest = headlines.load().get("benchmarks", {})
    out += [
        "",
        "## Latest figures",
        "",
        "| benchmark | figure | target | latest value | date | commit |",
        "|---|---|---|---|---|---|",
    ]
    notes = []
    for name, rows in headlines.HEADLINES.items():
        entry = latest.get(name)
        for h in rows:
            if entry is None:
                value, date, commit = "not recorded", "", ""
            else:
                value = _value((entry.get("figures") or {}).get(h.key), h.unit)
                date = str(entry.get("recorded", ""))[:10]
                commit = f"`{entry['commit']}`" if entry.get("commit") else "not recorded"
            out.append(f"| `{name}` | {_cell(h.figure)} | {_cell(h.target)} | {value} | {date} | {commit} |")
        if entry is not None and entry.get("source", "").startswith("transcribed"):
            notes.append(f"`{name}`: {entry['source']}.")
    if notes:
        out += ["", "Figures not yet recorded by `--record`:", ""] + [f"- {note}" for note in notes]
    return "\n".join(out)
