"""`python -m bench.media_derive [--reps 5] [--before SRC] [--json]`: what deriving one output costs.

Times the media step's file work for one clip: the sandboxed ffprobe gate, then `build_derivatives` for every
default profile (proxy MP4, HLS, thumbnail, and the waveform when there is audio). Reported per clip: wall time,
the CPU of the ffmpeg/ffprobe children (`getrusage(RUSAGE_CHILDREN)`: process start-up included, which is most
of it on a short clip) and the processes started. Two clips: the sim's standard output (its own renderer: 1 s,
160×90, 10 fps, silent) and a 5 s 720p clip with audio.

`--before SRC` measures a second source tree too (e.g. `git archive main | tar -x -C SRC`), interleaved rep by
rep with this one (A-B-A-B…), each derivation in a fresh interpreter, so both see the same machine load. A
command, not a test: the figures move with the machine's load, the process counts do not.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PROFILES = ["proxy_mp4", "hls", "thumbnail", "waveform"]


def _render_clips(out: Path) -> dict[str, Path]:
    from aivedio_engine.providers.sim.app import sample_mp4

    sim = out / "sim.mp4"
    sim.write_bytes(sample_mp4())
    hd = out / "hd5.mp4"
    subprocess.run(
        [
            *("ffmpeg", "-nostdin", "-hide_banner", "-v", "error", "-y"),
            *("-f", "lavfi", "-i", "testsrc2=size=1280x720:rate=25:duration=5"),
            *("-f", "lavfi", "-i", "sine=frequency=440:duration=5"),
            *("-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-c:a", "aac", "-shortest", str(hd)),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return {"sim 1 s 160x90 10 fps": sim, "5 s 720p + audio": hd}


def _derive_once(clip: Path) -> dict[str, Any]:
    """One derivation in this process (the child side): probe + every profile, measured."""
    from aivedio_engine.media import derive, sandbox
    from aivedio_engine.media.probe import MediaLimits, probe_file

    started: list[str] = []
    real = sandbox.spawn

    def spawn(argv: Any, **popen: Any) -> Any:
        started.append(next((Path(a).name for a in argv if Path(a).name in ("ffmpeg", "ffprobe")), str(argv[0])))
        return real(argv, **popen)

    sandbox.spawn = spawn  # type: ignore[assignment]
    limits = MediaLimits()
    with derive.job_dir() as work:
        before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        probe = probe_file(clip, "video", limits)
        results = derive.build_derivatives(clip, probe, work / "out", PROFILES, limits)  # type: ignore[arg-type]
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    statuses = {str(getattr(p, "value", p)): r.status for p, r in results.items()}
    return {
        "wall_ms": wall * 1000,
        "cpu_ms": cpu * 1000,
        "starts": started,
        "statuses": statuses,
        "code": str(Path(derive.__file__).resolve().parents[2]),
    }


def _run_child(src: Path, clip: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        # this file run as a script, so `src` need not have it; PYTHONPATH puts src's aivedio_engine first
        [sys.executable, str(Path(__file__).resolve()), "--child", str(clip)],
        cwd=src,
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return dict(json.loads(out.stdout))


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "reps": len(runs),
        "wall_ms_median": statistics.median(r["wall_ms"] for r in runs),
        "wall_ms_min": min(r["wall_ms"] for r in runs),
        "cpu_ms_median": statistics.median(r["cpu_ms"] for r in runs),
        "cpu_ms_min": min(r["cpu_ms"] for r in runs),
        "starts": runs[-1]["starts"],
        "statuses": runs[-1]["statuses"],
        "code": runs[-1]["code"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.media_derive", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="measured derivations per clip and tree (default 5)")
    parser.add_argument("--before", type=Path, default=None, help="another source tree to measure, interleaved")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(_derive_once(args.child)))
        return 0
    trees = {"after": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    doc: dict[str, Any] = {"reps": args.reps, "trees": {k: str(v) for k, v in trees.items()}, "clips": {}}
    with tempfile.TemporaryDirectory(prefix="aivedio-bench-media-") as tmp:
        for name, clip in _render_clips(Path(tmp)).items():
            runs: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
            for src in trees.values():  # warm-up: page cache, interpreter byte code
                _run_child(src, clip)
            for _ in range(args.reps):
                for tree, src in trees.items():
                    runs[tree].append(_run_child(src, clip))
            doc["clips"][name] = {tree: _summary(r) for tree, r in runs.items()}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"| clip | tree | wall ms (median / min) | child CPU ms (median / min) | processes | reps={args.reps}")
    print("|---|---|---|---|---|")
    for name, by_tree in doc["clips"].items():
        for tree, s in sorted(by_tree.items(), reverse=True):
            starts = ", ".join(f"{s['starts'].count(p)} {p}" for p in ("ffprobe", "ffmpeg"))
            print(
                f"| {name} | {tree} | {s['wall_ms_median']:.0f} / {s['wall_ms_min']:.0f} "
                f"| {s['cpu_ms_median']:.0f} / {s['cpu_ms_min']:.0f} | {starts} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
