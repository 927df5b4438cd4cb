"""The human report of a run: what users feel first (issue 12), then the ratios to the baselines, the points,
the baseline steps, the stage split, the CPU and the gate."""

from __future__ import annotations

import math
from typing import Any

from bench.common import fmt, table
from bench.e2e.analysis import DETAIL_LABELS, STAGE_LABELS
from bench.e2e.model import FLOOR_P50_X, IDLE_P99_MS, TARGET_P50_X, TARGET_P99_X
from bench.e2e.points import PROCESS_GROUPS


def _sp(s: dict[str, Any] | None, digits: int = 1) -> tuple[str, str]:
    if not s:
        return "—", "—"
    return fmt(s["median"], digits), f"{fmt(s['min'], digits)} – {fmt(s['max'], digits)}"


def _target(point: str, label: str, q: str) -> str:
    if label != "headline":
        return "(diagnostic)"
    if point == "load":
        return f"≤ {TARGET_P50_X:g}× (floor {FLOOR_P50_X:g}×)" if q == "p50" else f"≤ {TARGET_P99_X:g}×"
    return f"≤ {IDLE_P99_MS:g} ms" if q == "p99" else ""


def _verdict(point: str, label: str, q: str, ms: dict[str, Any] | None, ratio: dict[str, Any] | None) -> str:
    if label != "headline" or not ms or not ratio:
        return ""
    x, v = ratio["median"], ms["median"]
    if point == "load" and q == "p50":
        return "met" if x <= TARGET_P50_X else ("missed (floor met)" if x <= FLOOR_P50_X else "MISSED, floor too")
    if point == "load" and q == "p99":
        return "met" if x <= TARGET_P99_X else "MISSED"
    if point == "idle" and q == "p99":
        return "met" if v <= IDLE_P99_MS else "MISSED"
    return ""


def render(doc: dict[str, Any]) -> str:
    m, g, c = doc["machine"], doc["git"], doc["config"]
    out = [
        f"e2e_overhead — {doc['date']} — {m.get('nproc')} CPU {m.get('cpu', '')}, {m.get('memory_gib')} GiB — "
        f"commit {(g.get('commit') or '?')[:10]}{' (dirty tree)' if g.get('dirty') else ''} — "
        f"synchronous_commit={c['synchronous_commit']}, observe={c['observe']}, sim job {c['job_seconds']:g} s "
        f"(subtracted), scheduler tick {c['scheduler_interval_s']:g} s, {c['worker_threads']} worker threads, "
        f"{c['reps']} reps"
    ]
    sm = doc.get("summary")
    sat = doc.get("saturation") or {}
    if not sm:
        return "\n".join(out + ["", f"no result: {doc.get('error', 'nothing measured')}"])
    out += render_felt(sm.get("felt") or {})
    n = sm["total"]
    rate = sm.get("load_rate")
    load_label = f"load {rate:g}/s (50 % of saturation)" if rate else "load"
    rows = []
    for f in sm["figures"]:
        point = load_label if f["point"] == "load" else "idle, one task at a time"
        ms, msr = _sp(f["ms"], 1)
        ratio, ratior = _sp(f["ratio"], 1)
        anchor, _ = _sp(f["ratio_anchor"], 0)
        ms_all, _ = _sp(f["ms_all"], 1)
        ratio_all, _ = _sp(f["ratio_all"], 1)
        verdict = _verdict(f["point"], f["label"], f["q"], f["ms"], f["ratio"])
        if not verdict and f["ms"] is None:
            v_all = _verdict(f["point"], f["label"], f["q"], f["ms_all"], f["ratio_all"])
            verdict = f"{v_all} (all reps)" if v_all else ""
        v_anchor = _verdict(f["point"], f["label"], f["q"], f["ms_all"], f["ratio_anchor"])
        if verdict and f["point"] == "load" and v_anchor:
            verdict = f"{verdict}; vs anchor: {v_anchor}"
        rows.append(
            [
                point,
                f["label"],
                f["q"],
                ms,
                msr,
                f"{ratio}×",
                ratior,
                f"{f['kept']}/{n}",
                f"{anchor}×",
                f"{f['kept_anchor']}/{n}",
                ms_all,
                f"{ratio_all}×",
                _target(f["point"], f["label"], f["q"]),
                verdict,
            ]
        )
    bc, _ = _sp(sm["baseline_count_ms"], 2)
    bce, _ = _sp(sm["baseline_count_ex_media_ms"], 2)
    ba, bar = _sp(sm["baseline_anchor_ms"], 2)
    out += [
        "",
        f"Overhead = terminal seen − 202 − {sm['job_seconds']:g} s, in ms: median over the kept reps of each "
        f"rep's p50/p99. Ratio = ÷ the count-based baseline of the same rep, mean(A, B) (median {bc} ms; "
        f"media-excluded figures ÷ {bce} ms); anchor ratio = ÷ the C.4 formula (median {ba} ms), kept on its "
        "own A/B pair. 'all reps' = median over every repetition, discarded ones included.",
        table(
            [
                "point",
                "figure",
                "q",
                "ms",
                "ms spread",
                "ratio",
                "ratio spread",
                "kept",
                "anchor ratio",
                "kept",
                "ms, all reps",
                "ratio, all reps",
                "target",
                "verdict",
            ],
            rows,
        ),
    ]

    # points
    lv = []
    pts = sat.get("points", []) + [r[k] for r in doc.get("repetitions", []) for k in ("idle", "load")]
    for p in pts:
        s = p["summary"]["overhead_ms"]
        lv.append(
            [
                p["label"],
                fmt(p["offered_rate"]) if p.get("concurrency") is None else f"c={p['concurrency']}",
                fmt(p["achieved_send_rate"]),
                fmt(p.get("saturation_rate") or p["completion_rate"]),
                f"{p['succeeded']}/{p['sent']} of {p['tasks']}",
                fmt(s["p50"], 0),
                fmt(s["p99"], 0),
                fmt(s["max"], 0),
                "yes" if p["sustained"] else "NO: " + str(p["trend"].get("reason", "")),
                fmt(p["elapsed_s"], 0),
            ]
        )
    if lv:
        head = (
            "Points (open loop: offered tasks/s; closed loop: c tasks in flight; completed /s = finishes/s between "
            "the 10th and 90th percentile, or inside the CPU window for the saturation points):"
        )
        out += [
            "",
            head,
            table(
                [
                    "point",
                    "offered /s",
                    "sent /s",
                    "completed /s",
                    "succeeded/sent of planned",
                    "p50 ms",
                    "p99 ms",
                    "max ms",
                    "sustained",
                    "seconds",
                ],
                lv,
            ),
        ]

    # baselines
    counts, counts_ex = doc["config"]["step_counts"], doc["config"]["step_counts_ex_media"]
    counts = {**counts, "s3": 3 + sm["derived_files"]}
    counts_ex = {**counts_ex}
    st = sm["steps_ms"]
    brows = []
    for key, label in (
        ("commit", "durable commit, 1-row INSERT (pgbench c=1)"),
        ("hop", "Redis hop: LPUSH + BRPOP, 300 B (redis-benchmark c=1)"),
        ("http", "loopback HTTP: GET /healthz on the API, keep-alive"),
        ("s3", "S3 PUT 1 KiB to moto (boto3)"),
    ):
        med, sp = _sp(st.get(key), 3)
        contrib = st[key]["median"] * counts[key] if st.get(key) else math.nan
        brows.append([label, med, sp, counts[key], counts_ex[key], fmt(contrib, 2)])
    brows.append(["count-based baseline (Σ count × latency)", bc, _sp(sm["baseline_count_ms"], 2)[1], "", "", bc])
    for key, label, mult in (
        ("create_task", "anchor: create_task.sql (pgbench c=1)", 1),
        ("claim_outbox_1", "anchor: claim_outbox_1.sql (pgbench c=1)", 1),
        ("transition", "anchor: transition.sql (pgbench c=1)", 2),
        ("eval", "anchor: Dramatiq-style EVAL (redis-benchmark c=1)", 2),
    ):
        med, sp = _sp(st.get(key), 3)
        brows.append([label, med, sp, mult, "", fmt(st[key]["median"] * mult, 2) if st.get(key) else "—"])
    brows.append(["C.4 anchor formula (≈ 2.3 ms)", ba, bar, "", "", ba])
    out += [
        "",
        f"Baseline steps (ms, mean(A, B), median over all reps); counts per task from the code, S3 count = "
        f"HEAD + PUT raw + GET raw + {sm['derived_files']} derivative objects counted in the bucket:",
        table(["step", "latency ms", "spread", "count", "count ex media", "contribution ms"], brows),
    ]

    # stages
    srows = []
    for key, label in STAGE_LABELS + DETAIL_LABELS:
        cells = [label]
        for point in ("idle", "load"):
            for q in ("p50", "p99"):
                cells.append(_sp(sm["stages"][point][key][q], 1)[0])
        srows.append(cells)
    out += [
        "",
        "Where the time goes (ms; consecutive stages along the path from state-event timestamps, the "
        "webhook's received_at and the client's clocks; they sum to the headline; median over all reps):",
        table(["stage", "idle p50", "idle p99", "load p50", "load p99"], srows),
    ]

    # CPU
    groups = (*PROCESS_GROUPS, "pg_shared", "client", "other")
    crows = []
    for p in pts:
        cpu = p.get("cpu") or {}
        if cpu.get("window_rate"):
            per = {g: cpu.get(f"{g}_cores", math.nan) / cpu["window_rate"] for g in groups}
            crows.append(
                [p["label"], f"{100 * cpu.get('box_busy_fraction', math.nan):.0f} %", fmt(cpu["window_rate"])]
                + [fmt(1000 * per[g], 0) for g in groups]
            )
    if crows:
        out += [
            "",
            "CPU ms per task by process group, over the steady middle of each point (÷ the completions/s inside "
            "the window; media_children = the worker's ffprobe/ffmpeg; other = everything else on the shared box):",
            table(["point", "box busy", "tasks/s", *groups], crows),
        ]

    # per rep
    prow = []
    for r in doc.get("repetitions", []):
        ba_, bb_ = r["baselines"]["a"], r["baselines"]["b"]
        prow.append(
            [
                r["index"],
                fmt(ba_["count"], 2),
                fmt(bb_["count"], 2),
                f"{100 * r['headline_baseline_divergence']:.1f} %"
                if r["headline_baseline_divergence"] is not None
                else "—",
                fmt(ba_["anchor"], 3),
                fmt(bb_["anchor"], 3),
                f"{100 * r['anchor_baseline_divergence']:.1f} %",
                fmt(r["idle"]["summary"]["overhead_ms"]["p50"], 0),
                fmt(r["idle"]["summary"]["overhead_ms"]["p99"], 0),
                fmt(r["load"]["summary"]["overhead_ms"]["p50"], 0),
                fmt(r["load"]["summary"]["overhead_ms"]["p99"], 0),
                "yes" if r["kept"] else "DISCARDED",
                "yes" if r.get("kept_anchor") else "DISCARDED",
            ]
        )
    out += [
        "",
        "Per repetition (baselines in ms; overheads in ms):",
        table(
            [
                "rep",
                "count A",
                "count B",
                "A/B differ",
                "anchor A",
                "anchor B",
                "anchor differ",
                "idle p50",
                "idle p99",
                "load p50",
                "load p99",
                "kept (count)",
                "kept (anchor)",
            ],
            prow,
        ),
    ]

    gt = doc.get("gate")
    if gt:
        out += [
            "",
            f"Correctness gate: {'PASS' if gt['ok'] else 'FAIL'} — {gt['tasks']:,} tasks (client "
            f"{gt['client_tasks']:,}), SETTLE rows {gt['settle_rows']:,}, applied state events "
            f"{gt['applied_state_events']:,}, sim jobs {gt['sim_jobs']:,}, derivative objects per task "
            f"{fmt(gt['derived_objects_per_task'])}, client errors {gt['client_error_count']}",
        ]
        out += [f"  [{'x' if ok else ' '}] {name}" for name, ok in gt["checks"].items()]
        if gt["client_errors"]:
            out += [f"  first client errors: {gt['client_errors'][:3]}"]
    return "\n".join(out)


def _v(x: Any, digits: int = 0) -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt(x, digits)


def render_felt(f: dict[str, Any]) -> list[str]:
    """Issue 12's figures: idle overhead, hops, saturation, half load, CPU per task, each against its target."""
    if not f:
        return []
    t = f["targets"]
    mark = lambda key: {True: "met", False: "MISSED", None: "—"}[t.get(key)]  # noqa: E731
    hl, cpu = f["half_load"], f["cpu_s_per_task"]
    rows = [
        [
            "idle overhead p50 (one task at a time)",
            _v(f["idle_overhead_ms"]["p50"]),
            "ms",
            "≤ 150",
            mark("idle p50 <= 150 ms"),
        ],
        ["idle overhead p99", _v(f["idle_overhead_ms"]["p99"]), "ms", "≤ 300", mark("idle p99 <= 300 ms")],
        [
            "hop enqueue → actor start p50 (idle)",
            _v(f["idle_hop_ms"]["p50"], 1),
            "ms",
            "≤ 5",
            mark("hop (enqueue -> actor) p50 <= 5 ms"),
        ],
        ["hop enqueue → actor start p99 (idle)", _v(f["idle_hop_ms"]["p99"], 1), "ms", "", ""],
        [
            "saturation (closed loop, best c)",
            _v(f["saturation_tasks_per_s"], 2),
            f"tasks/s (c={f['saturation_concurrency']})",
            "≥ 12",
            mark("saturation >= 12 tasks/s"),
        ],
        [f"overhead p99 at 50 % of saturation ({_v(hl['rate'], 1)}/s)", _v(hl["p99_ms"]), "ms", "", ""],
        ["  ÷ idle p99", _v(hl["p99_over_idle_p99"], 2), "×", "≤ 2", mark("p99 at 50 % of saturation <= 2 x idle p99")],
        ["CPU per task at saturation, all groups", _v(cpu.get("total"), 3), "s", "half of before", ""],
    ]
    out = [
        "",
        "What users feel (issue 12; medians over the repetitions):",
        table(["figure", "value", "unit", "target", "verdict"], rows),
    ]
    st = f["idle_stages_ms"]
    out += [
        "",
        "Idle stage split (ms, from task_state_events, the stored webhook and the derivatives' ready_at):",
        table(
            ["stage", "p50", "p99"],
            [[label, _v(st[k]["p50"]), _v(st[k]["p99"])] for k, label in STAGE_LABELS + DETAIL_LABELS],
        ),
        "",
        "Idle hop by actor (ms, enqueue = outbox row's created_at → actor start):",
        table(
            ["actor", "n", "p50", "p99"],
            [[a, s["n"], _v(s["p50"], 1), _v(s["p99"], 1)] for a, s in f["idle_hop_ms"]["by_actor"].items()],
        ),
        "",
        "CPU seconds per task at saturation by process group: " + ", ".join(f"{g} {_v(v, 3)}" for g, v in cpu.items()),
    ]
    return out
