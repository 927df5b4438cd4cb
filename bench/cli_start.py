"""CLI start-up: wall time of `aivedio --help` and of shell-completion requests, as a person at a terminal feels it.

Each case runs the installed `aivedio` N times in a fresh process (hyperfine-style: warm-up runs first, then the
median, p90 and min of the measured runs). The baseline is the bare interpreter (`python -c pass`), measured right
before (A) and after (B) the cases, so a slow moment of the shared machine shows up as a slow baseline instead of
as a slow CLI. The target (issue 15): `--help` and completion in ≤ 0.5 s.

    python -m bench cli_start                 # 20 runs per case
    python -m bench cli_start --runs 5 --json
    python -m bench.cli_start --runs 10       # the same, without the bench driver
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import common

DESCRIPTION = "CLI start-up: `aivedio --help` and shell completion, median/p90 of N fresh processes"
TARGET_S = 0.5


def _completion(words: str) -> dict[str, str]:
    parts = words.split(" ")
    return {"_AIVEDIO_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1)}


def cases(aivedio: str, pg_url: str | None = None) -> list[tuple[str, list[str], dict[str, str]]]:
    """(label, argv, extra environment) of each measured command; with `pg_url`, tenant completion against that
    PostgreSQL database too."""
    server = f"aivedio --set database.url={pg_url} tasks list --tenant "
    server_case = [("complete: --tenant <TAB> (PostgreSQL)", [aivedio], _completion(server))] if pg_url else []
    return [
        ("aivedio --help", [aivedio, "--help"], {}),
        ("complete: aivedio ta<TAB>", [aivedio], _completion("aivedio ta")),
        ("complete: aivedio tasks list --status S<TAB>", [aivedio], _completion("aivedio tasks list --status S")),
        ("complete: aivedio generate --model <TAB>", [aivedio], _completion("aivedio generate --model ")),
        ("complete: aivedio generate --provider <TAB>", [aivedio], _completion("aivedio generate --provider ")),
        ("complete: aivedio tasks list --provider <TAB>", [aivedio], _completion("aivedio tasks list --provider ")),
        (
            "complete: aivedio generations list --status <TAB>",
            [aivedio],
            _completion("aivedio generations list --status "),
        ),
        (
            "complete: aivedio webhooks deliveries --state <TAB>",
            [aivedio],
            _completion("aivedio webhooks deliveries --state "),
        ),
        ("complete: aivedio alerts list --status <TAB>", [aivedio], _completion("aivedio alerts list --status ")),
        ("complete: aivedio tasks list --tenant <TAB>", [aivedio], _completion("aivedio tasks list --tenant ")),
        *server_case,
        ("aivedio states --format json", [aivedio, "states", "--format", "json"], {}),
    ]


def time_runs(argv: list[str], env: dict[str, str], runs: int, warmup: int) -> list[float]:
    full_env = {**os.environ, **env, "COLUMNS": "100"}
    samples = []
    for i in range(warmup + runs):
        start = time.perf_counter()
        done = subprocess.run(argv, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        elapsed = time.perf_counter() - start
        if done.returncode not in (0, 1):  # completion exits 1 when the shell gives no words; help exits 0
            raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr.decode(errors='replace')[-400:]}")
        if i >= warmup:
            samples.append(elapsed)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, max(0, round(0.9 * len(ordered)) - 1))]
    return {"median_s": statistics.median(ordered), "p90_s": p90, "min_s": ordered[0], "runs": len(ordered)}


def measure(runs: int, warmup: int, aivedio: str, pg_url: str | None = None) -> dict[str, Any]:
    baseline = [sys.executable, "-c", "pass"]
    result: dict[str, Any] = {"runs": runs, "warmup": warmup, "target_s": TARGET_S, "cases": {}}
    result["baseline_a"] = summary(time_runs(baseline, {}, runs, warmup))
    for label, argv, env in cases(aivedio, pg_url):
        result["cases"][label] = summary(time_runs(argv, env, runs, warmup))
    result["baseline_b"] = summary(time_runs(baseline, {}, runs, warmup))
    return result


def table(result: dict[str, Any]) -> str:
    lines = [
        f"| case ({result['runs']} runs) | median | p90 | min | ≤ {TARGET_S} s |",
        "|---|---|---|---|---|",
    ]
    for label in ("baseline_a", *result["cases"], "baseline_b"):
        s = result[label] if label.startswith("baseline") else result["cases"][label]
        name = {"baseline_a": "python -c pass (A)", "baseline_b": "python -c pass (B)"}.get(label, label)
        ok = "" if label.startswith("baseline") else ("yes" if s["median_s"] <= TARGET_S else "NO")
        lines.append(f"| {name} | {s['median_s']:.3f} s | {s['p90_s']:.3f} s | {s['min_s']:.3f} s | {ok} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=20, help="measured runs per case (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured runs first (default %(default)s)")
    parser.add_argument("--aivedio", default=None, help="the aivedio executable (default: next to this Python)")
    parser.add_argument("--json", action="store_true", help="print the JSON on stdout, the table on stderr")
    parser.add_argument(
        "--pg-url", default=None, help="a migrated PostgreSQL database (SQLAlchemy URL): adds its tenant completion"
    )


def run(args: argparse.Namespace) -> int:
    aivedio = args.aivedio or str(Path(sys.executable).with_name("aivedio"))
    if not Path(aivedio).exists():
        aivedio = shutil.which("aivedio") or aivedio
    result = measure(args.runs, args.warmup, aivedio, getattr(args, "pg_url", None))
    if getattr(args, "json_out", None):
        common.write_json(Path(args.json_out), result)
    if getattr(args, "json", False):
        print(table(result), file=sys.stderr)
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(table(result))
    return 0 if all(c["median_s"] <= TARGET_S for c in result["cases"].values()) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.cli_start", description=DESCRIPTION)
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
