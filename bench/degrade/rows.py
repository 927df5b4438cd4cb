"""The rows of the matrix: what each one takes away and what says must hold while it is gone.

A row's `watch` runs about once a second during the outage (observations only); its `judge` runs after recovery
and returns the failures, each a sentence a reader can act on. The checks every row shares (nothing lost,
nothing charged twice, everything terminal, the sim's duplicate paid jobs) are in `harness.py`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aivedio_engine.domain.status import TASK_TERMINAL, TaskStatus
from aivedio_engine.domain.transitions import BEFORE_DISPATCH, WITH_PROVIDER_JOB
from bench.degrade.load import Answer, Db, Load, call
from bench.degrade.system import DegradeSystem

PROBLEM_JSON = "application/problem+json"
#: a "fast" 503: the API must fail closed at once, not hold the client for a pool timeout
FAST_503_S = 2.0
FAILED = ("FAILED_FINAL", "FAILED_RETRYABLE", "RETRY_WAIT")


@dataclass
class Outage:
    system: DegradeSystem
    load: Load
    db: Db
    t_cut: float = 0.0
    t_restore: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    #: samples taken after the restore, until every task is terminal (rows with `watch_recovery` only)
    recovery_samples: list[dict[str, Any]] = field(default_factory=list)

    def during(self) -> list[Answer]:
        return self.load.between(self.t_cut, self.t_restore)


@dataclass(frozen=True)
class Row:
    name: str
    dependency: str  # the proxy cut, "dns" for the resolver switch, "media" for the media worker killed
    expected: str
    watch: Callable[[Outage], None]
    judge: Callable[[Outage], list[str]]
    #: the row's own set-up of the system (`DegradeSystem.setup`); none for the original six rows
    setup: dict[str, Any] = field(default_factory=dict)
    #: also watch after the restore (into `Outage.recovery_samples`), about once a second until all is terminal
    recover_watch: Callable[[Outage], None] | None = None
    #: after the warm-up, the cut waits (load going on, up to `READY_TIMEOUT_S`) until this holds: the path the
    #: row takes away must be seen working first, or the row would judge an outage of something not yet in use
    ready: Callable[[Outage], bool] | None = None


#: the longest the cut waits for a row's `ready` (a loaded machine may take a while to finish its first task)
READY_TIMEOUT_S = 120.0


def some_succeeded(o: Outage) -> bool:
    """At least one task went all the way to SUCCEEDED: fetch, store and media all worked before the cut."""
    return o.db.statuses().get("SUCCEEDED", 0) > 0


def _statuses_sample(o: Outage) -> None:
    try:
        o.samples.append(dict(o.db.statuses()))
    except Exception as exc:  # noqa: BLE001 - a sample, not a check
        o.samples.append({"error": str(exc)[:100]})


def _never_failed(o: Outage, kinds: tuple[str, ...] = FAILED) -> list[str]:
    worst = max((sum(s.get(k, 0) for k in kinds) for s in o.samples), default=0)
    return [f"{worst} task(s) failed or retry-waited during the outage"] if worst else []


def _creates_accepted(o: Outage, what: str) -> list[str]:
    bad = [a for a in o.during() if a.status != 202]
    if not bad:
        return []
    kinds = sorted({f"{a.status}" for a in bad})
    return [f"{len(bad)} of {len(o.during())} creates not accepted while {what} was down ({', '.join(kinds)})"]


# ------------------------------------------------------------------------------------------------ postgres
def _no_watch(o: Outage) -> None:
    """The database is what is gone: the load's answers are the observation."""


def _pg_judge(o: Outage) -> list[str]:
    out, answers = [], o.during()
    # a create in flight at the cut or the restore counts too: it too must be a 202 or a 503, never a 5xx
    wrong = [a for a in o.load.answers if a.status not in (202, 503)]
    if wrong:
        out.append(f"{len(wrong)} create(s) answered {sorted({str(a.status) for a in wrong})}: {wrong[0].error[:120]}")
    ok_503 = [a for a in answers if a.status == 503 and a.content_type.startswith(PROBLEM_JSON)]
    o.notes.update(
        creates_during=len(answers),
        fast_503=sum(1 for a in ok_503 if a.latency_s <= FAST_503_S),
        max_503_s=round(max((a.latency_s for a in ok_503), default=0.0), 3),
        accepted_during=sum(1 for a in answers if a.status == 202),
    )
    others = [a for a in answers if a not in ok_503 and a.status not in (202, 500)]
    if others:
        kinds = sorted({f"{a.status or 'no answer'}" for a in others})
        out.append(f"{len(others)} creates answered other than 202 or 503 problem+json ({', '.join(kinds)})")
    slow = [a for a in ok_503 if a.latency_s > FAST_503_S]
    if slow:
        out.append(f"{len(slow)} 503s slower than {FAST_503_S:g} s (max {o.notes['max_503_s']} s)")
    if not ok_503:
        out.append("no create was refused while PostgreSQL was unreachable")
    return out


# ------------------------------------------------------------------------------------------------ redis
def _redis_judge(o: Outage) -> list[str]:
    first, last = o.samples[0] if o.samples else {}, o.samples[-1] if o.samples else {}
    o.notes.update(queued_at_cut=first.get("QUEUED", 0), queued_at_restore=last.get("QUEUED", 0))
    return _never_failed(o) + _creates_accepted(o, "Redis")


# ------------------------------------------------------------------------------------------------ broker
def _broker_watch(o: Outage) -> None:
    _statuses_sample(o)
    try:
        o.samples[-1]["outbox_pending"] = o.db.outbox_pending()
    except Exception:  # noqa: BLE001 - a sample, not a check
        pass


def _broker_judge(o: Outage) -> list[str]:
    pending = max((s.get("outbox_pending", 0) for s in o.samples), default=0)
    o.notes.update(
        max_outbox_pending=pending,
        outbox_pending_after=o.db.outbox_pending(),
        outbox_due_after=o.db.outbox_pending(due_only=True),
    )
    out = _never_failed(o) + _creates_accepted(o, "the broker")
    if pending == 0:
        out.append("the outbox never held a row while the broker was down")
    if o.notes["outbox_due_after"]:
        out.append(f"{o.notes['outbox_due_after']} outbox rows due and still PENDING after recovery")
    return out


# ------------------------------------------------------------------------------------------------ storage
def _storage_judge(o: Outage) -> list[str]:
    held = max((s.get("OUTPUT_FETCHING", 0) + s.get("POST_PROCESSING", 0) for s in o.samples), default=0)
    o.notes["max_held_in_data_plane"] = held
    out = _never_failed(o)
    if held == 0:
        out.append("no task was held in OUTPUT_FETCHING/POST_PROCESSING while storage was down")
    o.notes["storage_alerts"] = o.db.alert_count("storage_unavailable")
    if o.notes["storage_alerts"] != 1:  # on call is told, once per store (services/store_outage.py)
        out.append(f"{o.notes['storage_alerts']} storage_unavailable alerts for one store outage (want 1)")
    missing = _succeeded_without_objects(o)
    o.notes["succeeded_without_stored_object"] = len(missing)
    if missing:
        out.append(f"{len(missing)} SUCCEEDED task(s) whose READY asset is not in the bucket: {missing[:3]}")
    return out


def _succeeded_without_objects(o: Outage) -> list[str]:
    import sqlalchemy as sa

    from aivedio_engine.db.tables import assets, generation_tasks

    s3: Any = o.system.direct_s3()
    q = (
        sa.select(assets.c.task_id, assets.c.bucket, assets.c.object_key)
        .join(generation_tasks, generation_tasks.c.id == assets.c.task_id)
        .where(generation_tasks.c.status == "SUCCEEDED", assets.c.status == "READY")
    )
    missing = []
    with o.db.engine.connect() as conn:
        for task_id, bucket, key in conn.execute(q):
            try:
                s3.head_object(Bucket=bucket, Key=key)
            except Exception:  # noqa: BLE001 - any miss is the finding
                missing.append(str(task_id))
    return sorted(set(missing))


# ------------------------------------------------------------------------------------------------ provider
def _provider_watch(o: Outage) -> None:
    _statuses_sample(o)
    from aivedio_engine.config import load_settings
    from aivedio_engine.domain.breaker import BreakerState
    from aivedio_engine.services.provider_health import provider_health

    settings = o.notes.setdefault("_settings", load_settings(str(o.system.config_path)))
    health = provider_health(o.db.engine, settings, datetime.now(UTC))
    if health.breakers.get("sim") and health.breakers["sim"].status(datetime.now(UTC)) is BreakerState.OPEN:
        o.notes["breaker_open_after_s"] = o.notes.get("breaker_open_after_s") or round(time.time() - o.t_cut, 1)
    # queries and cancels: one of each per second, on a task that is not finished
    api, key = o.system.api_url, o.system.api_key
    statuses = o.db.task_status()
    live = [t for t, s in statuses.items() if s not in _TERMINAL]
    cancelable = [t for t, s in statuses.items() if s in _CANCELABLE]
    if live:
        o.notes.setdefault("_queries", []).append(call("GET", f"{api}/v1/generations/{live[0]}", key))
    if cancelable:
        o.notes.setdefault("_cancels", []).append(call("POST", f"{api}/v1/generations/{cancelable[-1]}/cancel", key))


def _provider_judge(o: Outage) -> list[str]:
    queries: list[Answer] = o.notes.pop("_queries", [])
    cancels: list[Answer] = o.notes.pop("_cancels", [])
    o.notes.pop("_settings", None)
    o.notes.update(
        queries=len(queries),
        queries_200=sum(1 for a in queries if a.status == 200),
        cancels=len(cancels),
        cancels_2xx=sum(1 for a in cancels if a.status in (200, 202)),
        # the task moved past the point of cancellation (or finished) between the harness's read and the call:
        # the 409 the transition table prescribes is a served answer, counted apart
        cancels_409_moved_on=sum(1 for a in cancels if _moved_on(a)),
        cancel_answers=sorted({str(a.status) for a in cancels}),
    )
    # a submit refused before the breaker opened waits to be retried (RETRY_WAIT): that is the expected path
    out = _never_failed(o, ("FAILED_FINAL",))
    if "breaker_open_after_s" not in o.notes:
        out.append("the sim's breaker never opened while the provider was down")
    if not queries or o.notes["queries_200"] != len(queries):
        out.append(f"queries served {o.notes['queries_200']}/{len(queries)} while the provider was down")
    served = o.notes["cancels_2xx"] + o.notes["cancels_409_moved_on"]
    if not cancels or served != len(cancels):
        out.append(f"cancels served {served}/{len(cancels)} ({o.notes['cancel_answers']})")
    return out


_TERMINAL = {s.value for s in TASK_TERMINAL}
#: where a cancel is accepted (the transition table's CANCEL_REQUESTED rules; a repeat is answered too)
_CANCELABLE = {s.value for s in (*BEFORE_DISPATCH, *WITH_PROVIDER_JOB, TaskStatus.CANCEL_REQUESTED)}


def _moved_on(a: Answer) -> bool:
    return a.status == 409 and a.current_status is not None and a.current_status not in _CANCELABLE


# ------------------------------------------------------------------------------------------------ dns
def _dns_judge(o: Outage) -> list[str]:
    held = max((s.get("OUTPUT_FETCHING", 0) for s in o.samples), default=0)
    o.notes["max_output_fetching"] = held
    out = _never_failed(o)
    if held == 0:
        out.append("no task waited in OUTPUT_FETCHING while DNS failed (did any fetch run?)")
    return out


ROWS: dict[str, Row] = {
    r.name: r
    for r in (
        Row("postgres", "postgres", "fast 503 problem+json, never a lost 202", _no_watch, _pg_judge),
        Row(
            "redis",
            "redis",
            "dispatch from PostgreSQL counts or paused, nothing failed",
            _statuses_sample,
            _redis_judge,
        ),
        Row("broker", "broker", "creates accepted into the outbox, published after", _broker_watch, _broker_judge),
        Row(
            "storage",
            "storage",
            "held in OUTPUT_FETCHING/POST_PROCESSING, never SUCCEEDED unstored",
            _statuses_sample,
            _storage_judge,
            # on a loaded machine no task may have reached a fetch within the warm-up: the row would see nothing held
            ready=some_succeeded,
        ),
        Row("provider", "provider", "breaker open, queries and cancels still served", _provider_watch, _provider_judge),
        Row("dns", "dns", "fetch retried, nothing lost", _statuses_sample, _dns_judge, ready=some_succeeded),
    )
}
