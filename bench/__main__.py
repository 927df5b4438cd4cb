"""`python -m bench <name> [--reps 3] [--duration 20] [--json-out PATH] [--record] [benchmark options]`

`--record` keeps the run's headline figures (bench/headlines.py) with its date, commit and machine in the
committed bench/results/latest.json, from which `bash scripts/gen-docs` renders docs/benchmarks.md.

Exit codes: 0 done, 1 a correctness gate failed, 2 no repetition was valid (baselines diverged),
3 the benchmark could not run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from bench import common, headlines
from bench.common import BenchError

#: name -> module exposing DESCRIPTION, add_arguments(parser) and run(args) -> exit code
BENCHMARKS = {
    "api_create": "bench.api_create",
    "reducer": "bench.reducer",
    "e2e_overhead": "bench.e2e_overhead",
    "broker_hop": "bench.broker_hop",
    "cli_start": "bench.cli_start",
    "relay": "bench.relay",
    "backlog": "bench.backlog",
    "memory_inflight": "bench.memory_inflight",
    "chaos": "bench.chaos",
    "degrade": "bench.degrade.harness",
    "sse_fanout": "bench.sse_fanout",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description="aivedio benchmarks (A-B-A ratios)")
    sub = parser.add_subparsers(dest="name", metavar="<name>", required=True)
    for name, module_name in BENCHMARKS.items():
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.DESCRIPTION, description=module.DESCRIPTION)
        p.add_argument("--reps", type=int, default=3, help="A-B-A repetitions (default 3)")
        p.add_argument("--duration", type=int, default=20, help="seconds per measured point (default %(default)s)")
        p.add_argument("--json-out", default=None, help="JSON path (default bench/results/<name>-<time>.json)")
        p.add_argument(
            "--record",
            action="store_true",
            help="keep the headline figures in bench/results/latest.json (then run `bash scripts/gen-docs`)",
        )
        module.add_arguments(p)
        p.set_defaults(_module=module)
    args = parser.parse_args(argv)
    if args.reps < 1 or args.duration < 4:
        parser.error("--reps must be >= 1 and --duration >= 4")
    if args.record and not args.json_out:
        args.json_out = str(common.default_json_path(args.name))
    try:
        code = int(args._module.run(args))
        if args.record and code == 0:
            _record(args.name, Path(args.json_out), argv if argv is not None else sys.argv[1:])
        elif args.record:
            print(f"{args.name}: exit {code}, so nothing was recorded", file=sys.stderr)
        return code
    except BenchError as exc:
        print(f"{args.name}: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(f"{args.name}: interrupted", file=sys.stderr)
        return 130


def _record(name: str, path: Path, argv: list[str]) -> None:
    """A passing run's headline figures into latest.json (a failed run records nothing)."""
    if not path.exists():
        raise BenchError(f"no JSON document at {path}: nothing to record")
    doc = json.loads(path.read_text(encoding="utf-8"))
    entry = headlines.record(name, doc, "bench/run " + " ".join(argv))
    missing = [k for k, v in entry["figures"].items() if v is None]
    print(f"recorded {name} in {headlines.LATEST.relative_to(common.REPO)}", file=sys.stderr)
    if missing:
        print(f"warning: {name}: no value for {', '.join(missing)} in this run's document", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
