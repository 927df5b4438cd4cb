"""`python -m bench <name> [--reps 3] [--duration 20] [--json-out PATH] [benchmark options]`

Exit codes: 0 done, 1 a correctness gate failed, 2 no repetition was valid (baselines diverged),
3 the benchmark could not run.
"""

from __future__ import annotations

import argparse
import importlib
import sys

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
        module.add_arguments(p)
        p.set_defaults(_module=module)
    args = parser.parse_args(argv)
    if args.reps < 1 or args.duration < 4:
        parser.error("--reps must be >= 1 and --duration >= 4")
    try:
        return int(args._module.run(args))
    except BenchError as exc:
        print(f"{args.name}: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print(f"{args.name}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
