"""What a point's tasks show: the overhead per task (the terminal state seen by the client − the 202 − the sim's
job time), the stage split along the path from the database's own timestamps, the hop latency of every message
(outbox commit → relay publish → actor start), and the point's summary. Reads the database; times nothing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bench.e2e.client import TaskRun
from bench.e2e.stats import completion_rate, latency_summary, sustained, ts

#: the path in order; each stage is the time between two consecutive marks, and they sum to the headline
STAGE_LABELS = (
    ("dispatch_wait", "create → dispatch: 202 → DISPATCHING"),
    ("submit", "dispatch → submit: DISPATCHING → SUBMITTED (relay, hop, POST to the sim)"),
    ("provider_excess", "submit → provider done: SUBMITTED → succeeded webhook stored, − job_seconds"),
    ("fetched", "provider done → fetched: webhook stored → POST_PROCESSING (reducer, fetch: relay, hops, S3)"),
    ("media", "fetched → media done: POST_PROCESSING → last derivative READY (relay, hop, ffprobe/ffmpeg, S3)"),
    ("succeed", "media done → SUCCEEDED: last derivative READY → SUCCEEDED state event"),
    ("notify", "SUCCEEDED → seen by the client (outbox, relay, notify actor, PUBLISH, SSE)"),
)
#: finer rows shown under the stages (not part of the sum)
DETAIL_LABELS = (
    ("reduce", "of which: webhook stored → OUTPUT_FETCHING (relay, hop, reducer)"),
    ("fetch", "of which: OUTPUT_FETCHING → POST_PROCESSING (hop, download, S3)"),
    ("sim_late_ms", "of which the sim: webhook stored − (sim job created + job_seconds)"),
    ("post_ms", "(before the interval) POST → 202"),
)


def db_extras(db_url: str, task_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Per task: when the succeeded callback was stored, the attempt's provider request key, when each applied
    transition happened and when the last derivative became READY."""
    import psycopg

    out: dict[str, dict[str, Any]] = {t: {} for t in task_ids}
    if not task_ids:
        return out
    with psycopg.connect(db_url.replace("+psycopg", ""), autocommit=True) as conn:
        for task_id, received in conn.execute(
            "SELECT a.task_id::text, min(pe.received_at) FROM provider_events pe "
            "JOIN task_attempts a ON a.id = pe.matched_attempt_id "
            "WHERE a.task_id = ANY(%s::uuid[]) AND pe.observation->>'status' = 'succeeded' GROUP BY 1",
            (task_ids,),
        ):
            out[task_id]["callback_stored"] = received.timestamp()
        for task_id, key in conn.execute(
            "SELECT task_id::text, provider_request_key FROM task_attempts WHERE task_id = ANY(%s::uuid[])", (task_ids,)
        ):
            out[task_id]["request_key"] = key
        for task_id, status, at in conn.execute(
            "SELECT task_id::text, to_status, min(created_at) FROM task_state_events "
            "WHERE task_id = ANY(%s::uuid[]) AND outcome = 'applied' GROUP BY 1, 2",
            (task_ids,),
        ):
            out[task_id].setdefault("state_at", {})[status] = at.timestamp()
        for task_id, ready in conn.execute(
            "SELECT task_id::text, max(ready_at) FROM assets WHERE task_id = ANY(%s::uuid[]) "
            "AND kind NOT IN ('RAW_OUTPUT', 'INPUT_IMAGE', 'INPUT_VIDEO') GROUP BY 1",
            (task_ids,),
        ):
            if ready is not None:
                out[task_id]["media_done"] = ready.timestamp()
    return out


def task_metrics(run: TaskRun, extras: dict[str, Any], job_s: float, sim_created: float | None) -> dict[str, float]:
    """Overheads (ms) of one finished task and its stages along the path; the stages sum to the headline.
    Server marks come from the database (task_state_events, provider_events, assets), the SSE `at` otherwise."""
    ev = {k: v[0] for k, v in run.events.items()}
    ev.update(extras.get("state_at", {}))
    ms = lambda a, b: (b - a) * 1000  # noqa: E731
    job_ms = job_s * 1000
    nan = math.nan
    succeeded_at = ev.get("SUCCEEDED", nan)
    media_done = extras.get("media_done", succeeded_at)
    post_processing = ev.get("POST_PROCESSING", nan)
    head = ms(run.t_202, run.t_terminal) - job_ms
    cb = extras.get("callback_stored", nan)
    media_all = ms(post_processing, succeeded_at)
    out = {
        "overhead_ms": head,
        "committed_ms": ms(run.t_202, succeeded_at) - job_ms,
        "media_ms": media_all,
        "overhead_ex_media_ms": head - media_all,
        "post_ms": ms(run.t_send, run.t_202),
        "dispatch_wait": ms(run.t_202, ev.get("DISPATCHING", nan)),
        "submit": ms(ev.get("DISPATCHING", nan), ev.get("SUBMITTED", nan)),
        "provider_excess": ms(ev.get("SUBMITTED", nan), cb) - job_ms,
        "fetched": ms(cb, post_processing),
        "reduce": ms(cb, ev.get("OUTPUT_FETCHING", nan)),
        "fetch": ms(ev.get("OUTPUT_FETCHING", nan), post_processing),
        "media": ms(post_processing, media_done),
        "succeed": ms(media_done, succeeded_at),
        "notify": ms(succeeded_at, run.t_terminal),
    }
    if sim_created is not None:
        # the sim's own lateness: its ticker and its callback-delivery thread
        out["sim_late_ms"] = ms(sim_created, cb) - job_ms
    return out


def parse_hop_lines(lines: Sequence[str], since_ms: float, until_ms: float) -> dict[str, tuple[str, float, float]]:
    """message id → (actor, message timestamp ms, actor start ms) of the first start inside [since, until] (a
    redelivery is not a hop); malformed lines are skipped."""
    started: dict[str, tuple[str, float, float]] = {}
    for line in lines:
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 4:
            continue
        try:
            stamp, start = float(parts[2]), float(parts[3])
        except ValueError:
            continue
        if since_ms <= start <= until_ms and parts[0] not in started:
            started[parts[0]] = (parts[1], stamp, start)
    return started


def hop_rows(db_url: str, lines: Sequence[str], since_ms: float, until_ms: float) -> list[dict[str, Any]]:
    """The probe's lines (see `bench.e2e.probe`) of actors started in [since, until], joined to their outbox rows:
    per message the actor, enqueue → start (the whole hop), enqueue → publish (outbox and relay) and publish →
    start (the broker), in ms."""
    import psycopg

    started = parse_hop_lines(lines, since_ms, until_ms)
    if not started:
        return []
    with psycopg.connect(db_url.replace("+psycopg", ""), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id::text, created_at, published_at FROM outbox_events WHERE id = ANY(%s::uuid[])",
            (list(started),),
        ).fetchall()
    out = []
    for mid, created, published in rows:
        actor, _stamp, start = started[mid]
        c = created.timestamp() * 1000
        p = published.timestamp() * 1000 if published else math.nan
        out.append({"actor": actor, "hop_ms": start - c, "relay_ms": p - c, "broker_ms": start - p})
    return out


def hop_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    by_actor: dict[str, list[float]] = {}
    for r in rows:
        by_actor.setdefault(r["actor"], []).append(r["hop_ms"])
    return {
        "messages": len(rows),
        "hop_ms": latency_summary([r["hop_ms"] for r in rows]),
        "relay_ms": latency_summary([r["relay_ms"] for r in rows]),
        "broker_ms": latency_summary([r["broker_ms"] for r in rows]),
        "by_actor": {a: latency_summary(v) for a, v in sorted(by_actor.items())},
    }


def analyse_point(
    label: str,
    rate: float,
    runs: list[TaskRun],
    elapsed: float,
    extras: dict[str, dict[str, Any]],
    sim_jobs: list[dict[str, Any]],
    job_s: float,
    info: dict[str, Any],
) -> dict[str, Any]:
    ok = [r for r in runs if r.terminal == "SUCCEEDED" and r.task_id]
    created = {j["request_key"]: ts(j["created_at"].replace("Z", "+00:00")) for j in sim_jobs if j.get("request_key")}
    per_task = []
    for r in ok:
        x = extras.get(r.task_id or "", {})
        per_task.append(task_metrics(r, x, job_s, created.get(x.get("request_key", ""))))
    keys = ["overhead_ms", "committed_ms", "media_ms", "overhead_ex_media_ms"]
    keys += [k for k, _ in STAGE_LABELS + DETAIL_LABELS if k not in keys]
    summary = {k: latency_summary([m[k] for m in per_task if k in m]) for k in keys}
    sent = [r for r in runs if math.isfinite(r.t_send)]
    send_span = (max(r.t_send for r in sent) - min(r.t_send for r in sent)) if len(sent) > 1 else 0.0
    completed = completion_rate([r.t_terminal for r in ok])
    closed = info.get("concurrency") is not None
    ok_trend, trend = sustained(
        [(r.scheduled, m["overhead_ms"]) for r, m in zip(ok, per_task, strict=True)],
        len([r for r in runs if not (closed and r.unsent)]),
        offered=None if closed else rate,
        completed=completed,
    )
    stopped = info.get("stopped_at_backlog")
    if stopped:
        trend["reason"] = (
            f"sending stopped after {stopped['sent']} of {len(runs)} tasks ({stopped['after_s']} s): "
            "the backlog reached --max-backlog"
        )
    statuses: dict[str, int] = {}
    for r in runs:
        if not r.unsent:
            statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1
    return {
        "label": label,
        "offered_rate": rate,
        "concurrency": info.get("concurrency"),
        "tasks": len(runs),
        "sent": len(sent),
        "succeeded": len(ok),
        "stopped_at_backlog": stopped,
        "achieved_send_rate": (len(sent) - 1) / send_span if send_span > 0 else math.nan,
        "completion_rate": completed,
        "elapsed_s": round(elapsed, 2),
        "sustained": ok_trend,
        "trend": trend,
        "summary": summary,
        "post_statuses": statuses,
        "errors": [r.error for r in runs if r.error][:5],
        "error_count": sum(1 for r in runs if r.error),
        "get_polls": sum(r.get_polls for r in runs),
        "client": [
            {
                "key": r.key,
                "task_id": r.task_id,
                "unsent": r.unsent,
                "scheduled": r.scheduled,
                "t_send": r.t_send,
                "t_202": r.t_202,
                "t_terminal": r.t_terminal,
                "terminal": r.terminal,
                "get_status": r.get_status,
                "outputs": r.outputs,
                "error": r.error,
            }
            for r in runs
        ],
    }
