"""`aivedio audit`: the invariants of reliability_anchors §4.4 that our own tables can answer, as SQL.

Each check is one query returning the *offending* rows (none = the invariant holds), with the id of the anchor it
implements (I<n>.<k>: the k-th query of invariant n; I2.3, I4.6 and I8.4 are ours) and a one-line description.
The chaos checker runs the same ideas against the simulator's ground truth; the checks that need it are listed in
SKIPPED with the reason, so the report says what was *not* verified. I8.2 needs a listing of the object store,
which is not SQL: it reads the newest clean `storage_scans` row the scanner recorded (none yet = nothing known).

A live database is never quiescent: work in flight is normal. Checks about time ("nothing stuck", "outbox
drained", "no task past its deadline") therefore only count rows older than a grace period (`grace_s`, default
15 min: several sweeper intervals), and MANUAL_REVIEW tasks with an open review item count as parked (a human
holds them). Queries are SQLAlchemy Core and run on PostgreSQL and SQLite alike (window functions and FILTER
need SQLite >= 3.30). Money is compared after rounding to the ledger's 8 decimals, so SQLite's binary floats
cannot raise a false alarm.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import ColumnElement, Connection, Engine

from aivedio_engine.clock import Clock
from aivedio_engine.db import alerts as alert_rules
from aivedio_engine.db.tables import (
    alerts,
    assets,
    credit_ledger,
    generation_tasks,
    inbox_dedup,
    outbox_events,
    projects,
    provider_events,
    review_items,
    slot_grants,
    storage_scans,
    task_attempts,
    task_state_events,
    tenants,
)
from aivedio_engine.domain.events import ROUTES, EventType
from aivedio_engine.domain.status import (
    ATTEMPT_IN_FLIGHT,
    TASK_TERMINAL,
    AlertStatus,
    AssetKind,
    AssetStatus,
    CancelOutcome,
    LedgerEntryType,
    OutboxStatus,
    ReviewState,
    StateEventOutcome,
    TaskStatus,
)
from aivedio_engine.domain.transitions import TASK_MACHINE
from aivedio_engine.services import intake, reducer
from aivedio_engine.services.errors import InvalidInput

_t, _a, _e, _l, _o = generation_tasks.c, task_attempts.c, task_state_events.c, credit_ledger.c, outbox_events.c
_as, _pe, _r, _al = assets.c, provider_events.c, review_items.c, alerts.c
LE = LedgerEntryType
TERMINAL = [s.value for s in TASK_TERMINAL]
APPLIED = StateEventOutcome.APPLIED.value
OPEN_REVIEW = (ReviewState.PENDING.value, ReviewState.CLAIMED.value)
DEFAULT_GRACE_S = 900.0
#: actors whose consumer records every delivery in inbox_dedup; the others dedup by state (submit: the attempt's
#: NEW → SENDING), record only when they act (fetch, media skip stale requests), or are not deduplicated by design
#: (notifications are best effort, DESIGN §12)
INBOX_CONSUMERS = {
    ROUTES[EventType.GENERATION_QUEUED].actor: intake.CONSUMER_GROUP,
    ROUTES[EventType.PROVIDER_STATUS_OBSERVED].actor: reducer.CONSUMER_GROUP,
}


@dataclass(frozen=True, slots=True)
class Scope:
    dialect: str
    now: datetime
    grace: timedelta

    @property
    def cutoff(self) -> datetime:
        return self.now - self.grace


@dataclass(frozen=True, slots=True)
class Check:
    id: str
    description: str
    query: Callable[[Scope], sa.Select[Any]]


@dataclass(frozen=True, slots=True)
class Skipped:
    id: str
    description: str
    why: str


@dataclass(frozen=True, slots=True)
class CheckResult:
    id: str
    description: str
    violations: int
    rows: list[dict[str, Any]]  # the first `limit` offending rows

    @property
    def ok(self) -> bool:
        return self.violations == 0


@dataclass(frozen=True)
class AuditReport:
    results: list[CheckResult]
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)


CHECKS: dict[str, Check] = {}


def check(id: str, description: str) -> Callable[[Callable[[Scope], sa.Select[Any]]], Callable[..., Any]]:
    def register(fn: Callable[[Scope], sa.Select[Any]]) -> Callable[[Scope], sa.Select[Any]]:
        assert id not in CHECKS, id
        CHECKS[id] = Check(id, description, fn)
        return fn

    return register


def uuid_text(scope: Scope, col: Any) -> ColumnElement[str]:
    """A UUID column as canonical text (how keys and alert subjects spell it): SQLite stores 32 hex digits."""
    if scope.dialect == "postgresql":
        return sa.cast(col, sa.Text)
    part = [sa.func.substr(col, start, n) for start, n in ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))]
    return sa.func.lower(sa.func.printf("%s-%s-%s-%s-%s", *part, type_=sa.Text), type_=sa.Text)


def money_differs(a: Any, b: Any) -> ColumnElement[bool]:
    return sa.func.round(a - b, 8) != 0


def _dupes(*cols: Any) -> sa.Select[Any]:
    return sa.select(*cols, sa.func.count().label("rows")).group_by(*cols).having(sa.func.count() > 1)


def _open_review() -> Any:
    return sa.exists().where(_r.task_id == _t.id, _r.state.in_(OPEN_REVIEW))


# --- I1 creates ------------------------------------------------------------------------------------------------


@check("I1.2", "one task per (tenant, idempotency key): retried creates never make a second task")
def _i1_2(s: Scope) -> sa.Select[Any]:
    return _dupes(_t.tenant_id, _t.client_idempotency_key)


# --- I2 liveness -----------------------------------------------------------------------------------------------


@check("I2.1", "nothing stuck: no unparked, non-terminal task untouched and unscheduled for longer than the grace")
def _i2_1(s: Scope) -> sa.Select[Any]:
    waiting_for_human = sa.and_(_t.status == TaskStatus.MANUAL_REVIEW.value, _open_review())
    return sa.select(_t.id.label("task_id"), _t.status, _t.updated_at, _t.next_action_at).where(
        _t.status.not_in(TERMINAL),
        _t.parked_reason.is_(None),
        sa.not_(waiting_for_human),
        _t.updated_at < s.cutoff,
        sa.or_(_t.next_action_at.is_(None), _t.next_action_at < s.cutoff),
        sa.or_(_t.next_retry_at.is_(None), _t.next_retry_at < s.cutoff),
    )


@check("I2.2", "every parked task has an open alert (a human was told)")
def _i2_2(s: Scope) -> sa.Select[Any]:
    told = sa.exists().where(_al.subject_id == uuid_text(s, _t.id), _al.status != AlertStatus.RESOLVED.value)
    return sa.select(_t.id.label("task_id"), _t.status, _t.parked_reason).where(
        _t.status.not_in(TERMINAL), _t.parked_reason.is_not(None), sa.not_(told)
    )


@check("I2.3", "every MANUAL_REVIEW task has an open review item (else nobody can decide it)")
def _i2_3(s: Scope) -> sa.Select[Any]:
    return sa.select(_t.id.label("task_id"), _t.review_state).where(
        _t.status == TaskStatus.MANUAL_REVIEW.value, sa.not_(_open_review())
    )


# --- I3 provider jobs ------------------------------------------------------------------------------------------


@check("I3.4", "at most one in-flight attempt per task")
def _i3_4(s: Scope) -> sa.Select[Any]:
    return _dupes(_a.task_id).where(_a.submit_state.in_([st.value for st in ATTEMPT_IN_FLIGHT]))


# --- I4 ledger -------------------------------------------------------------------------------------------------


@check("I4.1", "each ledger business key is booked once")
def _i4_1(s: Scope) -> sa.Select[Any]:
    return _dupes(_l.business_key)


@check("I4.2", "one RESERVE per task, at most one SETTLE/RELEASE, exactly one once terminal (if it cost anything)")
def _i4_2(s: Scope) -> sa.Select[Any]:
    reserves = sa.func.count().filter(_l.entry_type == LE.RESERVE.value)
    closings = sa.func.count().filter(_l.entry_type.in_([LE.SETTLE.value, LE.RELEASE.value]))
    return (
        sa.select(_t.id.label("task_id"), _t.status, reserves.label("reserves"), closings.label("closings"))
        .select_from(generation_tasks.outerjoin(credit_ledger, _l.task_id == _t.id))
        .group_by(_t.id, _t.status, _t.estimated_cost)
        .having(
            sa.or_(reserves != 1, closings > 1, sa.and_(_t.status.in_(TERMINAL), _t.estimated_cost > 0, closings != 1))
        )
    )


@check("I4.3", "a finished task's ledger rows (except adjustments) sum to minus its actual cost")
def _i4_3(s: Scope) -> sa.Select[Any]:
    total = sa.func.sum(_l.amount)
    return (
        sa.select(_t.id.label("task_id"), _t.status, _t.actual_cost, total.label("ledger_sum"))
        .select_from(generation_tasks.join(credit_ledger, _l.task_id == _t.id))
        .where(_t.status.in_(TERMINAL), _l.entry_type != LE.ADJUSTMENT.value)
        .group_by(_t.id, _t.status, _t.actual_cost)
        .having(money_differs(total, -sa.func.coalesce(_t.actual_cost, 0)))
    )


@check("I4.4", "no tenant's ledger sums below zero")
def _i4_4(s: Scope) -> sa.Select[Any]:
    total = sa.func.sum(_l.amount)
    return sa.select(_l.tenant_id, total.label("ledger_sum")).group_by(_l.tenant_id).having(sa.func.round(total, 8) < 0)


@check("I4.5", "a task's ledger rows belong to the task's tenant")
def _i4_5(s: Scope) -> sa.Select[Any]:
    return (
        sa.select(_l.id.label("ledger_id"), _l.task_id, _l.tenant_id, _t.tenant_id.label("task_tenant_id"))
        .select_from(credit_ledger.join(generation_tasks, _t.id == _l.task_id))
        .where(_l.tenant_id != _t.tenant_id)
    )


@check("I4.6", "each tenant's balance cache equals the sum of its ledger")
def _i4_6(s: Scope) -> sa.Select[Any]:
    sums = sa.select(_l.tenant_id, sa.func.sum(_l.amount).label("total")).group_by(_l.tenant_id).subquery()
    ledger_sum = sa.func.coalesce(sums.c.total, 0)
    return (
        sa.select(tenants.c.id.label("tenant_id"), tenants.c.credit_balance, ledger_sum.label("ledger_sum"))
        .select_from(tenants.outerjoin(sums, sums.c.tenant_id == tenants.c.id))
        .where(money_differs(tenants.c.credit_balance, ledger_sum))
    )


@check(
    "I4.8",
    "each closing follows the settlement table (domain/settlement.py): a SETTLE charges min(reservation, price "
    "list × the vendor's billed units) — nothing where the vendor said 'not billed' — or a late bill's REFUND "
    "brings it there; refunds never exceed the charge",
)
def _i4_8(s: Scope) -> sa.Select[Any]:
    def of(kind: LedgerEntryType) -> Any:
        return sa.func.coalesce(sa.func.sum(sa.case((_l.entry_type == kind.value, _l.amount), else_=0)), 0)

    rows = (
        sa.select(
            _l.task_id,
            (-of(LE.RESERVE)).label("reserved"),
            of(LE.SETTLE).label("settle_amount"),
            sa.func.count().filter(_l.entry_type == LE.SETTLE.value).label("settles"),
            of(LE.REFUND).label("refunds"),
        )
        .where(_l.task_id.is_not(None))
        .group_by(_l.task_id)
        .subquery()
    )
    last = task_attempts.alias("last_attempt")
    newest = sa.select(sa.func.max(_a.attempt_no)).where(_a.task_id == _t.id).scalar_subquery()
    seconds = sa.func.coalesce(_t.params["duration_s"].as_float(), 1.0)
    outputs = sa.func.coalesce(_t.params["n"].as_float(), 1.0)
    no_units = sa.and_(last.c.billed_seconds.is_(None), last.c.billed_outputs.is_(None))
    ratio = sa.case(
        (no_units, 1.0),
        else_=sa.func.coalesce(last.c.billed_seconds * 1.0 / seconds, 1.0)
        * sa.func.coalesce(last.c.billed_outputs * 1.0 / outputs, 1.0),
    )
    bill = _t.estimated_cost * ratio
    expected = sa.case((last.c.vendor_billed.is_(False), 0), (bill < rows.c.reserved, bill), else_=rows.c.reserved)
    charged = rows.c.reserved - rows.c.settle_amount
    tolerance = 0.000001
    # the SETTLE matches the bill, or its charge less the refunds does (a bill reported after the close)
    off = sa.and_(
        sa.func.abs(charged - expected) > tolerance, sa.func.abs(charged - rows.c.refunds - expected) > tolerance
    )
    return (
        sa.select(
            _t.id.label("task_id"),
            _t.status,
            charged.label("charged"),
            expected.label("table_says"),
            rows.c.refunds,
            last.c.vendor_billed,
            last.c.billed_seconds,
        )
        .select_from(
            generation_tasks.join(rows, rows.c.task_id == _t.id).outerjoin(
                last, sa.and_(last.c.task_id == _t.id, last.c.attempt_no == newest)
            )
        )
        .where(
            _t.status.in_(TERMINAL),
            _t.reserved_amount == 0,
            sa.or_(
                sa.and_(
                    rows.c.settles > 0,
                    sa.or_(off, rows.c.refunds > charged + tolerance),
                ),
                sa.and_(rows.c.settles == 0, rows.c.refunds > 0),
            ),
        )
    )


# --- I5 history ------------------------------------------------------------------------------------------------


@check("I5.1", "each task's applied history has contiguous versions")
def _i5_1(s: Scope) -> sa.Select[Any]:
    prev = sa.func.lag(_e.task_version).over(partition_by=_e.task_id, order_by=_e.task_version)
    h = sa.select(_e.task_id, _e.task_version, prev.label("previous")).where(_e.outcome == APPLIED).subquery()
    return sa.select(h.c.task_id, h.c.previous, h.c.task_version).where(
        h.c.previous.is_not(None), h.c.task_version != h.c.previous + 1
    )


def allowed_transitions() -> list[str]:
    """'FROM>TO' for every edge of the task machine, plus creation ('>CREATED')."""
    return sorted(
        {f">{TaskStatus.CREATED.value}"} | {f"{e.source.value}>{e.target.value}" for e in TASK_MACHINE.edges()}
    )


@check("I5.2", "every applied transition is an edge of the task state machine")
def _i5_2(s: Scope) -> sa.Select[Any]:
    pair = sa.func.coalesce(_e.from_status, "") + ">" + sa.func.coalesce(_e.to_status, "")
    return sa.select(_e.task_id, _e.task_version, _e.from_status, _e.to_status, _e.event_type).where(
        _e.outcome == APPLIED, pair.not_in(allowed_transitions())
    )


@check("I5.3", "terminal states are sticky: no applied transition leaves one")
def _i5_3(s: Scope) -> sa.Select[Any]:
    return sa.select(_e.task_id, _e.task_version, _e.from_status, _e.to_status).where(
        _e.outcome == APPLIED, _e.from_status.in_(TERMINAL)
    )


@check("I5.4", "each task row matches its last applied state event (status and version)")
def _i5_4(s: Scope) -> sa.Select[Any]:
    last_v = (
        sa.select(_e.task_id, sa.func.max(_e.task_version).label("v"))
        .where(_e.outcome == APPLIED)
        .group_by(_e.task_id)
        .subquery()
    )
    last = task_state_events.alias("last")
    on = sa.and_(last.c.task_id == last_v.c.task_id, last.c.task_version == last_v.c.v, last.c.outcome == APPLIED)
    return (
        sa.select(
            _t.id.label("task_id"),
            _t.status,
            _t.version,
            last.c.to_status.label("last_event_status"),
            last.c.task_version.label("last_event_version"),
        )
        .select_from(generation_tasks.outerjoin(last_v, last_v.c.task_id == _t.id).outerjoin(last, on))
        .where(sa.or_(last.c.id.is_(None), last.c.to_status != _t.status, last.c.task_version != _t.version))
    )


@check("I5.5", "each (source, source_event_id) is recorded once")
def _i5_5(s: Scope) -> sa.Select[Any]:
    return _dupes(_e.source, _e.source_event_id)


# --- I6 messaging ----------------------------------------------------------------------------------------------


@check("I6.1", "the outbox drains: nothing PENDING past its available_at by more than the grace")
def _i6_1(s: Scope) -> sa.Select[Any]:
    return sa.select(_o.id.label("event_id"), _o.event_type, _o.target, _o.available_at, _o.publish_attempts).where(
        _o.status == OutboxStatus.PENDING.value, _o.available_at < s.cutoff
    )


@check("I6.2", "no outbox row is DEAD")
def _i6_2(s: Scope) -> sa.Select[Any]:
    return sa.select(_o.id.label("event_id"), _o.event_type, _o.target, _o.last_error).where(
        _o.status == OutboxStatus.DEAD.value
    )


@check("I6.3", "every published event of an inbox consumer (intake, reducer) was consumed")
def _i6_3(s: Scope) -> sa.Select[Any]:
    group = sa.case(*((_o.target == actor, grp) for actor, grp in INBOX_CONSUMERS.items()))
    consumed = sa.exists().where(inbox_dedup.c.event_id == _o.id, inbox_dedup.c.consumer_group == group)
    return sa.select(_o.id.label("event_id"), _o.event_type, _o.target, _o.published_at).where(
        _o.status == OutboxStatus.PUBLISHED.value,
        _o.target.in_(list(INBOX_CONSUMERS)),
        _o.published_at < s.cutoff,
        sa.not_(consumed),
    )


@check("I6.4", "attempt numbers are unique per task")
def _i6_4(s: Scope) -> sa.Select[Any]:
    return _dupes(_a.task_id, _a.attempt_no)


@check("I6.5", "one raw output asset per (task, attempt, output index)")
def _i6_5(s: Scope) -> sa.Select[Any]:
    return _dupes(_as.task_id, _as.attempt_id, _as.output_index).where(_as.kind == AssetKind.RAW_OUTPUT.value)


# --- I7 fencing ------------------------------------------------------------------------------------------------


@check("I7.2", "fencing tokens only grow: no slot grant carries a token below an earlier grant's")
def _i7_2(s: Scope) -> sa.Select[Any]:
    g = slot_grants.c
    prev = sa.func.lag(g.fencing_token).over(partition_by=g.scope, order_by=(g.created_at, g.fencing_token))
    h = sa.select(g.id, g.scope, g.fencing_token, g.created_at, prev.label("previous_token")).subquery()
    return sa.select(h.c.id.label("grant_id"), h.c.scope, h.c.previous_token, h.c.fencing_token).where(
        h.c.previous_token.is_not(None), h.c.fencing_token <= h.c.previous_token
    )


# --- I8 storage (rows only) ------------------------------------------------------------------------------------


@check("I8.3", "every object key starts with tenants/{the asset's tenant}/ (or workflows/{a project of that tenant}/)")
def _i8_3(s: Scope) -> sa.Select[Any]:
    prefix = "tenants/" + uuid_text(s, _as.tenant_id) + "/"
    # System B's step files and deliveries live under workflows/{project}/ (workflows/executors.py); the tenant
    # purge and retention find them through the project rows
    project_prefix = "workflows/" + uuid_text(s, projects.c.id) + "/"
    own_project = sa.exists().where(
        projects.c.tenant_id == _as.tenant_id,
        sa.func.substr(_as.object_key, 1, sa.func.length(project_prefix)) == project_prefix,
    )
    return sa.select(_as.id.label("asset_id"), _as.tenant_id, _as.object_key).where(
        sa.func.substr(_as.object_key, 1, sa.func.length(prefix)) != prefix, sa.not_(own_project)
    )


@check("I8.2", "no orphan object (no row references it) in the newest storage scan (`aivedio storage scan`)")
def _i8_2(s: Scope) -> sa.Select[Any]:
    # the listing is the scanner's job (a bucket listing is not SQL); the audit reads its newest clean outcome
    sc = storage_scans.c
    newest = sa.select(sa.func.max(sc.finished_at)).where(sc.error.is_(None)).scalar_subquery()
    return sa.select(sc.id.label("scan_id"), sc.finished_at, sc.orphans, sc.orphan_bytes, sc.sample).where(
        sc.finished_at == newest, sc.error.is_(None), sc.orphans > 0
    )


@check("I8.4", "READY outputs and derivatives record the size and checksum the storage check compares")
def _i8_4(s: Scope) -> sa.Select[Any]:
    return sa.select(_as.id.label("asset_id"), _as.kind, _as.size_bytes, _as.checksum_value).where(
        _as.status == AssetStatus.READY.value,
        sa.or_(_as.kind == AssetKind.RAW_OUTPUT.value, _as.parent_asset_id.is_not(None)),
        sa.or_(_as.size_bytes.is_(None), _as.checksum_value.is_(None)),
    )


# --- I9 terminal correctness -----------------------------------------------------------------------------------


@check("I9.1", "no SUCCEEDED task without a READY playable derivative (proxy or HLS) of its output")
def _i9_1(s: Scope) -> sa.Select[Any]:
    playable = sa.exists().where(
        _as.parent_asset_id == _t.output_asset_id,
        _as.status == AssetStatus.READY.value,
        _as.kind.in_([AssetKind.PROXY.value, AssetKind.HLS.value]),
    )
    # an output retention or a tenant purge deleted on purpose (services/retention.py, tenant_purge.py)
    deleted = sa.exists().where(_as.id == _t.output_asset_id, _as.status == AssetStatus.DELETED.value)
    return sa.select(_t.id.label("task_id"), _t.output_asset_id).where(
        _t.status == TaskStatus.SUCCEEDED.value, sa.not_(playable), sa.not_(deleted)
    )


@check("I9.2", "no unparked task still non-terminal past its deadline (by more than the grace)")
def _i9_2(s: Scope) -> sa.Select[Any]:
    return sa.select(_t.id.label("task_id"), _t.status, _t.deadline_at).where(
        _t.status.not_in(TERMINAL), _t.parked_reason.is_(None), _t.deadline_at < s.cutoff
    )


@check("I9.3", "cancel_outcome TOO_LATE only where a completion won over a requested cancel")
def _i9_3(s: Scope) -> sa.Select[Any]:
    won = sa.exists().where(
        _e.task_id == _t.id,
        _e.outcome == APPLIED,
        _e.from_status == TaskStatus.CANCEL_REQUESTED.value,
        _e.to_status == TaskStatus.OUTPUT_FETCHING.value,
    )
    return sa.select(_t.id.label("task_id"), _t.status, _t.cancel_outcome).where(
        _t.cancel_outcome == CancelOutcome.TOO_LATE.value, sa.not_(won)
    )


# --- I10 raw event accounting ----------------------------------------------------------------------------------


@check("I10.1", "every matched provider event was classified by the reducer (applied, duplicate, stale, ...)")
def _i10_1(s: Scope) -> sa.Select[Any]:
    classified = sa.exists().where(_e.source == _pe.source, _e.source_event_id == _pe.dedup_key)
    return sa.select(_pe.id.label("provider_event_id"), _pe.provider, _pe.provider_job_id, _pe.received_at).where(
        sa.not_(_pe.orphan), _pe.received_at < s.cutoff, sa.or_(_pe.matched_attempt_id.is_(None), sa.not_(classified))
    )


@check("I10.2", "no orphan provider event outlived its TTL without an alert")
def _i10_2(s: Scope) -> sa.Select[Any]:
    alerted = sa.exists().where(
        _al.rule == alert_rules.Rule.ORPHAN_CALLBACK_EXPIRED.value, _al.dedup_key == uuid_text(s, _pe.id)
    )
    return sa.select(_pe.id.label("provider_event_id"), _pe.provider, _pe.provider_job_id, _pe.expires_at).where(
        _pe.orphan, _pe.expires_at < s.cutoff, sa.not_(alerted)
    )


SIM = "needs the provider's ground truth (the simulator's sim.* tables or a vendor's records), not our tables"
SKIPPED: list[Skipped] = [
    Skipped(
        "I1.1",
        "acknowledged creates are never lost",
        "needs the client's log of acknowledged creates (sim.client_ops): our tables cannot show a write they "
        "never received",
    ),
    Skipped("I3.1", "exactly one provider job per submitted task", SIM),
    Skipped("I3.2", "duplicate jobs only after a resubmitted ambiguous submit", SIM),
    Skipped("I3.3", "every provider job is linked to an attempt or an orphan record", SIM),
    Skipped(
        "I4.7",
        "every provider-billed duplicate or orphan job has an ADJUSTMENT row",
        SIM + "; for a vendor, `aivedio ledger reconcile --invoice` compares its invoice",
    ),
    Skipped("I7.1", "provider concurrency never exceeded", SIM),
    Skipped(
        "I7.3",
        "releases with a stale fencing token are rejected",
        "needs slot_events, which the schema does not have (the slot store keeps no event log)",
    ),
    Skipped(
        "I8.1",
        "every READY object exists with the recorded size and checksum",
        "needs HEAD requests to the object store, not SQL (I8.4 checks the recorded half)",
    ),
]


class InvariantService:
    def __init__(self, engine: Engine, clock: Clock) -> None:
        self._engine = engine
        self._clock = clock

    def run(self, *, grace_s: float = DEFAULT_GRACE_S, limit: int = 20, only: list[str] | None = None) -> AuditReport:
        """Run every check (or the ids in `only`) in one snapshot: REPEATABLE READ on PostgreSQL (a SQLite read
        transaction is one already), so checks that compare tables never see a change land between them."""
        if grace_s < 0:
            raise InvalidInput(f"grace must be >= 0 seconds, got {grace_s:g}", field="grace")
        unknown = sorted(set(only or ()) - set(CHECKS) - {s.id for s in SKIPPED})
        if unknown:
            raise InvalidInput(f"unknown check id(s): {', '.join(unknown)}", field="check")
        chosen = [c for c in CHECKS.values() if not only or c.id in only]
        with self._engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                scope = Scope(conn.dialect.name, self._clock.now(), timedelta(seconds=grace_s))
                results = [_run(conn, c, scope, limit) for c in chosen]
        return AuditReport(results, [s for s in SKIPPED if not only or s.id in only])


def _run(conn: Connection, c: Check, scope: Scope, limit: int) -> CheckResult:
    stmt = c.query(scope)
    count = conn.execute(sa.select(sa.func.count()).select_from(stmt.subquery())).scalar_one()
    rows = [dict(r._mapping) for r in conn.execute(stmt.limit(limit))] if count else []
    return CheckResult(c.id, c.description, int(count), rows)


# the motion invariants (I2.4, I2.5, I7.4, I10.3) register themselves into CHECKS
from aivedio_engine.services import invariants_motion  # noqa: E402, F401
