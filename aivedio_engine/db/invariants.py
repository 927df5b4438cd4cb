"""The queries of `aivedio audit` (services.invariants): each returns a SELECT of the rows that break one invariant
(none = it holds), and `count`/`sample` run it in the caller's snapshot. The ledger's queries are in
`db.invariants_ledger`, the motion ones in `db.stalled`.

Queries are SQLAlchemy Core and run on PostgreSQL and SQLite alike (window functions and FILTER need SQLite >=
3.30). Checks about time only count rows older than `Scope.cutoff`: a live database always has work in flight.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import ColumnElement, Connection

from aivedio_engine.db.alerts import Rule
from aivedio_engine.db.tables import (
    alerts,
    assets,
    callback_rejections,
    generation_tasks,
    inbox_dedup,
    outbox_events,
    projects,
    provider_events,
    review_items,
    storage_scans,
    task_attempts,
    task_state_events,
)
from aivedio_engine.domain.status import (
    ATTEMPT_IN_FLIGHT,
    TASK_TERMINAL,
    AlertStatus,
    AssetKind,
    AssetStatus,
    CancelOutcome,
    OutboxStatus,
    ReviewState,
    StateEventOutcome,
    TaskStatus,
)
from aivedio_engine.domain.transitions import TASK_MACHINE

#: the offending rows of one check, as a statement (`count` and `sample` run it)
Offenders = sa.Select[Any]

_t, _a, _e, _o = generation_tasks.c, task_attempts.c, task_state_events.c, outbox_events.c
_as, _pe, _r, _al = assets.c, provider_events.c, review_items.c, alerts.c
TERMINAL = [s.value for s in TASK_TERMINAL]
APPLIED = StateEventOutcome.APPLIED.value
OPEN_REVIEW = (ReviewState.PENDING.value, ReviewState.CLAIMED.value)


@dataclass(frozen=True, slots=True)
class Scope:
    dialect: str
    now: datetime
    grace: timedelta
    #: I4.9: the derivative profiles a variant needs READY to count as delivered
    delivered_profiles: frozenset[str] = frozenset()
    #: I10.4: failed callback verifications in one window that must have raised an alert
    callback_verify_failures: int = 1
    #: I3.5: the vendor's jobs as (provider, job id, request key), when its list was given
    vendor_jobs: tuple[tuple[str, str, str | None], ...] = ()

    @property
    def cutoff(self) -> datetime:
        return self.now - self.grace


def snapshot(conn: Connection) -> Connection:
    """`conn` reading one snapshot for its whole transaction: REPEATABLE READ on PostgreSQL (a SQLite read
    transaction is one already), so checks that compare tables never see a change land between them."""
    if conn.dialect.name == "postgresql":
        return conn.execution_options(isolation_level="REPEATABLE READ")
    return conn


def count(conn: Connection, stmt: Offenders) -> int:
    return int(conn.execute(sa.select(sa.func.count()).select_from(stmt.subquery())).scalar_one())


def sample(conn: Connection, stmt: Offenders, limit: int) -> list[dict[str, Any]]:
    """The first `limit` offending rows, column name → value."""
    return [dict(r._mapping) for r in conn.execute(stmt.limit(limit))]


def uuid_text(dialect: str, col: Any) -> ColumnElement[str]:
    """A UUID column as canonical text (how keys and alert subjects spell it): SQLite stores 32 hex digits."""
    if dialect == "postgresql":
        return sa.cast(col, sa.Text)
    part = [sa.func.substr(col, start, n) for start, n in ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))]
    return sa.func.lower(sa.func.printf("%s-%s-%s-%s-%s", *part, type_=sa.Text), type_=sa.Text)


def dupes(*cols: Any) -> Offenders:
    return sa.select(*cols, sa.func.count().label("rows")).group_by(*cols).having(sa.func.count() > 1)


def _open_review() -> Any:
    return sa.exists().where(_r.task_id == _t.id, _r.state.in_(OPEN_REVIEW))


# --- I1 creates ------------------------------------------------------------------------------------------------


def duplicate_creates(s: Scope) -> Offenders:
    return dupes(_t.tenant_id, _t.client_idempotency_key)


# --- I2 liveness -----------------------------------------------------------------------------------------------


def stuck_tasks(s: Scope) -> Offenders:
    waiting_for_human = sa.and_(_t.status == TaskStatus.MANUAL_REVIEW.value, _open_review())
    return sa.select(_t.id.label("task_id"), _t.status, _t.updated_at, _t.next_action_at).where(
        _t.status.not_in(TERMINAL),
        _t.parked_reason.is_(None),
        sa.not_(waiting_for_human),
        _t.updated_at < s.cutoff,
        sa.or_(_t.next_action_at.is_(None), _t.next_action_at < s.cutoff),
        sa.or_(_t.next_retry_at.is_(None), _t.next_retry_at < s.cutoff),
    )


def parked_without_alert(s: Scope) -> Offenders:
    told = sa.exists().where(_al.subject_id == uuid_text(s.dialect, _t.id), _al.status != AlertStatus.RESOLVED.value)
    return sa.select(_t.id.label("task_id"), _t.status, _t.parked_reason).where(
        _t.status.not_in(TERMINAL), _t.parked_reason.is_not(None), sa.not_(told)
    )


def review_without_item(s: Scope) -> Offenders:
    return sa.select(_t.id.label("task_id"), _t.review_state).where(
        _t.status == TaskStatus.MANUAL_REVIEW.value, sa.not_(_open_review())
    )


# --- I3 provider jobs ------------------------------------------------------------------------------------------


def concurrent_attempts(s: Scope) -> Offenders:
    return dupes(_a.task_id).where(_a.submit_state.in_([st.value for st in ATTEMPT_IN_FLIGHT]))


# --- I5 history ------------------------------------------------------------------------------------------------


def version_gaps(s: Scope) -> Offenders:
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


def illegal_transitions(s: Scope) -> Offenders:
    pair = sa.func.coalesce(_e.from_status, "") + ">" + sa.func.coalesce(_e.to_status, "")
    return sa.select(_e.task_id, _e.task_version, _e.from_status, _e.to_status, _e.event_type).where(
        _e.outcome == APPLIED, pair.not_in(allowed_transitions())
    )


def transitions_out_of_terminal(s: Scope) -> Offenders:
    return sa.select(_e.task_id, _e.task_version, _e.from_status, _e.to_status).where(
        _e.outcome == APPLIED, _e.from_status.in_(TERMINAL)
    )


def tasks_unlike_last_event(s: Scope) -> Offenders:
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


def duplicate_source_events(s: Scope) -> Offenders:
    return dupes(_e.source, _e.source_event_id)


# --- I6 messaging ----------------------------------------------------------------------------------------------


def undrained_outbox(s: Scope) -> Offenders:
    return sa.select(_o.id.label("event_id"), _o.event_type, _o.target, _o.available_at, _o.publish_attempts).where(
        _o.status == OutboxStatus.PENDING.value, _o.available_at < s.cutoff
    )


def dead_outbox(s: Scope) -> Offenders:
    return sa.select(_o.id.label("event_id"), _o.event_type, _o.target, _o.last_error).where(
        _o.status == OutboxStatus.DEAD.value
    )


def unconsumed_events(s: Scope, consumers: Mapping[str, str]) -> Offenders:
    """Published events for the actors in `consumers` (actor → the consumer group that records each delivery in
    inbox_dedup) that no delivery of that group recorded."""
    group = sa.case(*((_o.target == actor, grp) for actor, grp in consumers.items()))
    consumed = sa.exists().where(inbox_dedup.c.event_id == _o.id, inbox_dedup.c.consumer_group == group)
    return sa.select(_o.id.label("event_id"), _o.event_type, _o.target, _o.published_at).where(
        _o.status == OutboxStatus.PUBLISHED.value,
        _o.target.in_(list(consumers)),
        _o.published_at < s.cutoff,
        sa.not_(consumed),
    )


def duplicate_attempt_numbers(s: Scope) -> Offenders:
    return dupes(_a.task_id, _a.attempt_no)


def duplicate_raw_outputs(s: Scope) -> Offenders:
    return dupes(_as.task_id, _as.attempt_id, _as.output_index).where(_as.kind == AssetKind.RAW_OUTPUT.value)


# --- I7 fencing ------------------------------------------------------------------------------------------------


def shrinking_fencing_tokens(s: Scope) -> Offenders:
    """The attempt row is the grant's record (the dispatcher writes `lease.fence` into it in the transaction that
    creates it; the slot reconciler only raises it while the attempt is in flight). Fences come from one counter
    that only grows, and a task's next attempt is granted only after the one before it left flight, so a fence
    held by two attempts, or one not above the task's previous attempt's, means fences were issued again."""
    earlier = sa.func.lag(_a.fencing_token).over(partition_by=_a.task_id, order_by=_a.attempt_no)
    holders = sa.func.count().over(partition_by=_a.fencing_token)
    h = (
        sa.select(
            _a.id, _a.task_id, _a.attempt_no, _a.fencing_token, earlier.label("earlier_token"), holders.label("holders")
        )
        .where(_a.fencing_token.is_not(None))
        .subquery()
    )
    return sa.select(
        h.c.id.label("attempt_id"), h.c.task_id, h.c.attempt_no, h.c.fencing_token, h.c.earlier_token, h.c.holders
    ).where(sa.or_(h.c.holders > 1, sa.and_(h.c.earlier_token.is_not(None), h.c.fencing_token <= h.c.earlier_token)))


# --- I8 storage (rows only) ------------------------------------------------------------------------------------


def foreign_object_keys(s: Scope) -> Offenders:
    prefix = "tenants/" + uuid_text(s.dialect, _as.tenant_id) + "/"
    # System B's step files and deliveries live under workflows/{project}/ (workflows/executors.py); the tenant
    # purge and retention find them through the project rows
    project_prefix = "workflows/" + uuid_text(s.dialect, projects.c.id) + "/"
    own_project = sa.exists().where(
        projects.c.tenant_id == _as.tenant_id,
        sa.func.substr(_as.object_key, 1, sa.func.length(project_prefix)) == project_prefix,
    )
    return sa.select(_as.id.label("asset_id"), _as.tenant_id, _as.object_key).where(
        sa.func.substr(_as.object_key, 1, sa.func.length(prefix)) != prefix, sa.not_(own_project)
    )


def orphans_in_newest_scan(s: Scope) -> Offenders:
    # the listing is the scanner's job (a bucket listing is not SQL); the audit reads its newest clean outcome
    sc = storage_scans.c
    newest = sa.select(sa.func.max(sc.finished_at)).where(sc.error.is_(None)).scalar_subquery()
    return sa.select(sc.id.label("scan_id"), sc.finished_at, sc.orphans, sc.orphan_bytes, sc.sample).where(
        sc.finished_at == newest, sc.error.is_(None), sc.orphans > 0
    )


def ready_assets_without_checksum(s: Scope) -> Offenders:
    return sa.select(_as.id.label("asset_id"), _as.kind, _as.size_bytes, _as.checksum_value).where(
        _as.status == AssetStatus.READY.value,
        sa.or_(_as.kind == AssetKind.RAW_OUTPUT.value, _as.parent_asset_id.is_not(None)),
        sa.or_(_as.size_bytes.is_(None), _as.checksum_value.is_(None)),
    )


# --- I9 terminal correctness -----------------------------------------------------------------------------------


def succeeded_without_playable(s: Scope) -> Offenders:
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


def past_deadline(s: Scope) -> Offenders:
    return sa.select(_t.id.label("task_id"), _t.status, _t.deadline_at).where(
        _t.status.not_in(TERMINAL), _t.parked_reason.is_(None), _t.deadline_at < s.cutoff
    )


def unearned_too_late(s: Scope) -> Offenders:
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


def unclassified_provider_events(s: Scope) -> Offenders:
    classified = sa.exists().where(_e.source == _pe.source, _e.source_event_id == _pe.dedup_key)
    return sa.select(_pe.id.label("provider_event_id"), _pe.provider, _pe.provider_job_id, _pe.received_at).where(
        sa.not_(_pe.orphan), _pe.received_at < s.cutoff, sa.or_(_pe.matched_attempt_id.is_(None), sa.not_(classified))
    )


def expired_orphans_without_alert(s: Scope) -> Offenders:
    alerted = sa.exists().where(
        _al.rule == Rule.ORPHAN_CALLBACK_EXPIRED.value, _al.dedup_key == uuid_text(s.dialect, _pe.id)
    )
    return sa.select(_pe.id.label("provider_event_id"), _pe.provider, _pe.provider_job_id, _pe.expires_at).where(
        _pe.orphan, _pe.expires_at < s.cutoff, sa.not_(alerted)
    )


def unalerted_callback_failures(s: Scope) -> Offenders:
    """A window with enough failed callback verifications that the alert evaluator, which reads the current and
    the previous window every `alerts.interval_s`, would have raised `callback_verify_failures` for its provider
    by now (its last failure is older than the grace), yet no such alert was seen since the window began."""
    r = callback_rejections.c
    windows = (
        sa.select(
            r.provider,
            r.window_start,
            sa.func.sum(r.failures).label("failures"),
            sa.func.max(r.last_at).label("last_at"),
        )
        .group_by(r.provider, r.window_start)
        .subquery()
    )
    alerted = sa.exists().where(
        _al.rule == Rule.CALLBACK_VERIFY_FAILURES.value,
        _al.dedup_key == windows.c.provider,
        _al.last_seen_at >= windows.c.window_start,
    )
    return sa.select(windows.c.provider, windows.c.window_start, windows.c.failures, windows.c.last_at).where(
        windows.c.failures >= s.callback_verify_failures, windows.c.last_at < s.cutoff, sa.not_(alerted)
    )
