"""`aivedio audit`: the invariants that our own tables can answer, as SQL.

Each check is one query returning the *offending* rows (none = the invariant holds), with the id of the anchor it
implements (I<n>.<k>: the k-th query of invariant n; I2.3, I4.6, I4.9, I8.4 and I10.4 are ours) and a one-line
description. Checks that depend on configuration (I4.9's delivered derivatives, I10.4's alert threshold) read the
settings the service was built with. The chaos checker runs the same ideas against the simulator's ground truth;
the checks that need it are listed in SKIPPED with the reason, so the report says what was *not* verified. I8.2
needs a listing of the object store, which is not SQL: it reads the newest clean `storage_scans` row the scanner
recorded (none yet = nothing known).

A live database is never quiescent: work in flight is normal. Checks about time ("nothing stuck", "outbox
drained", "no task past its deadline") therefore only count rows older than a grace period (`grace_s`, default
15 min: several sweeper intervals), and MANUAL_REVIEW tasks with an open review item count as parked (a human
holds them). The queries are in the persistence layer (`db.invariants`, the ledger's in `db.invariants_ledger`,
the motion ones in `db.stalled`); this module names them, runs them in one snapshot and assembles the report.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

from aivedio_engine.clock import Clock
from aivedio_engine.config import AlertSettings, MediaSettings, Settings
from aivedio_engine.db import invariants as q
from aivedio_engine.db import invariants_jobs as jobs
from aivedio_engine.db import invariants_ledger as ledger
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.invariants import Offenders, Scope
from aivedio_engine.domain.events import ROUTES, EventType
from aivedio_engine.services import intake, late_jobs, reducer
from aivedio_engine.services.delivery import delivery_profiles
from aivedio_engine.services.errors import InvalidInput

DEFAULT_GRACE_S = 900.0
#: actors whose consumer records every delivery in inbox_dedup; the others dedup by state (submit: the attempt's
#: NEW → SENDING), record only when they act (fetch, media skip stale requests), or are not deduplicated by design
#: (notifications are best effort)
INBOX_CONSUMERS = {
    ROUTES[EventType.GENERATION_QUEUED].actor: intake.CONSUMER_GROUP,
    ROUTES[EventType.PROVIDER_STATUS_OBSERVED].actor: reducer.CONSUMER_GROUP,
    ROUTES[EventType.PROVIDER_CANCEL_REQUESTED].actor: late_jobs.CANCEL_GROUP,
}


@dataclass(frozen=True, slots=True)
class Check:
    id: str
    description: str
    query: Callable[[Scope], Offenders]


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


def check(id: str, description: str, query: Callable[[Scope], Offenders]) -> None:
    assert id not in CHECKS, id
    CHECKS[id] = Check(id, description, query)


# --- I1 creates ------------------------------------------------------------------------------------------------
check("I1.2", "one task per (tenant, idempotency key): retried creates never make a second task", q.duplicate_creates)

# --- I2 liveness -----------------------------------------------------------------------------------------------
check(
    "I2.1",
    "nothing stuck: no unparked, non-terminal task untouched and unscheduled for longer than the grace",
    q.stuck_tasks,
)
check("I2.2", "every parked task has an open alert (a human was told)", q.parked_without_alert)
check("I2.3", "every MANUAL_REVIEW task has an open review item (else nobody can decide it)", q.review_without_item)

# --- I3 provider jobs ------------------------------------------------------------------------------------------
check("I3.4", "at most one in-flight attempt per task", q.concurrent_attempts)
check(
    "I3.5",
    "every vendor job known for a task is the job of one attempt or a recorded duplicate with a platform-cost row"
    " (the vendor's list, when given, names the jobs we never heard of)",
    jobs.unaccounted_vendor_jobs,
)

# --- I4 ledger -------------------------------------------------------------------------------------------------
check("I4.1", "each ledger business key is booked once", ledger.duplicate_business_keys)
check(
    "I4.2",
    "one RESERVE per task, at most one SETTLE/RELEASE, exactly one once terminal (if it cost anything)",
    ledger.unbalanced_reservations,
)
check(
    "I4.3",
    "a finished task's ledger rows (except adjustments) sum to minus its actual cost",
    ledger.ledger_unlike_actual_cost,
)
check("I4.4", "no tenant's ledger sums below zero", ledger.negative_tenant_ledgers)
check("I4.5", "a task's ledger rows belong to the task's tenant", ledger.rows_of_another_tenant)
check("I4.6", "each tenant's balance cache equals the sum of its ledger", ledger.stale_balance_caches)
check(
    "I4.8",
    "each closing follows the settlement table (domain/settlement.py): a SETTLE charges min(reservation, price "
    "list × the vendor's billed units) — nothing where the vendor said 'not billed' — or a late bill's REFUND "
    "brings it there; refunds never exceed the charge",
    ledger.closings_off_the_table,
)
check(
    "I4.9",
    "no closed task charged more than estimate ÷ n × the variants it delivered (a cancel, an EXPIRED task and a "
    "reviewer's reject are left to the vendor's bill)",
    ledger.charged_past_delivery,
)

# --- I5 history ------------------------------------------------------------------------------------------------
check("I5.1", "each task's applied history has contiguous versions", q.version_gaps)
check("I5.2", "every applied transition is an edge of the task state machine", q.illegal_transitions)
check("I5.3", "terminal states are sticky: no applied transition leaves one", q.transitions_out_of_terminal)
check("I5.4", "each task row matches its last applied state event (status and version)", q.tasks_unlike_last_event)
check("I5.5", "each (source, source_event_id) is recorded once", q.duplicate_source_events)

# --- I6 messaging ----------------------------------------------------------------------------------------------
check("I6.1", "the outbox drains: nothing PENDING past its available_at by more than the grace", q.undrained_outbox)
check("I6.2", "no outbox row is DEAD", q.dead_outbox)
check(
    "I6.3",
    "every published event of an inbox consumer (intake, reducer) was consumed",
    partial(q.unconsumed_events, consumers=INBOX_CONSUMERS),
)
check("I6.4", "attempt numbers are unique per task", q.duplicate_attempt_numbers)
check("I6.5", "one raw output asset per (task, attempt, output index)", q.duplicate_raw_outputs)

# --- I7 fencing ------------------------------------------------------------------------------------------------
check(
    "I7.2",
    "fencing tokens only grow: no fence granted to two attempts, none at or below the task's previous attempt's",
    q.shrinking_fencing_tokens,
)

# --- I8 storage (rows only) ------------------------------------------------------------------------------------
check(
    "I8.3",
    "every object key starts with tenants/{the asset's tenant}/ (or workflows/{a project of that tenant}/)",
    q.foreign_object_keys,
)
check(
    "I8.2",
    "no orphan object (no row references it) in the newest storage scan (`aivedio storage scan`)",
    q.orphans_in_newest_scan,
)
check(
    "I8.4",
    "READY outputs and derivatives record the size and checksum the storage check compares",
    q.ready_assets_without_checksum,
)

# --- I9 terminal correctness -----------------------------------------------------------------------------------
check(
    "I9.1",
    "no SUCCEEDED task without a READY playable derivative (proxy or HLS) of its output",
    q.succeeded_without_playable,
)
check("I9.2", "no unparked task still non-terminal past its deadline (by more than the grace)", q.past_deadline)
check("I9.3", "cancel_outcome TOO_LATE only where a completion won over a requested cancel", q.unearned_too_late)

# --- I10 raw event accounting ----------------------------------------------------------------------------------
check(
    "I10.1",
    "every matched provider event was classified by the reducer (applied, duplicate, stale, ...)",
    q.unclassified_provider_events,
)
check("I10.2", "no orphan provider event outlived its TTL without an alert", q.expired_orphans_without_alert)
check(
    "I10.4",
    "every window of failed callback verifications past `alerts.callback_verify_failures` raised an alert",
    q.unalerted_callback_failures,
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
    def __init__(self, engine: Engine, clock: Clock, settings: Settings | None = None) -> None:
        """`settings`: what the checks that depend on configuration read (None: the configuration's defaults)."""
        self._engine = engine
        self._clock = clock
        self._media = settings.media if settings is not None else MediaSettings()
        self._alerts = settings.alerts if settings is not None else AlertSettings()

    def run(
        self,
        *,
        grace_s: float = DEFAULT_GRACE_S,
        limit: int = 20,
        only: list[str] | None = None,
        vendor_jobs: Sequence[tuple[str, str, str | None]] = (),
    ) -> AuditReport:
        """Run every check (or the ids in `only`) in one snapshot: REPEATABLE READ on PostgreSQL (a SQLite read
        transaction is one already), so checks that compare tables never see a change land between them.
        `vendor_jobs`: the vendor's own jobs (provider, job id, request key) for I3.5."""
        if grace_s < 0:
            raise InvalidInput(f"grace must be >= 0 seconds, got {grace_s:g}", field="grace")
        unknown = sorted(set(only or ()) - set(CHECKS) - {s.id for s in SKIPPED})
        if unknown:
            raise InvalidInput(f"unknown check id(s): {', '.join(unknown)}", field="check")
        chosen = [c for c in CHECKS.values() if not only or c.id in only]
        with self._engine.connect() as conn:
            conn = q.snapshot(conn)
            with conn.begin():
                scope = Scope(
                    conn.dialect.name,
                    self._clock.now(),
                    timedelta(seconds=grace_s),
                    delivered_profiles=delivery_profiles(self._media),
                    callback_verify_failures=self._alerts.callback_verify_failures,
                    vendor_jobs=tuple(vendor_jobs),
                )
                results = [_run(conn, c, scope, limit) for c in chosen]
        return AuditReport(results, [s for s in SKIPPED if not only or s.id in only])


def parse_vendor_jobs(text: str) -> list[tuple[str, str, str | None]]:
    """A vendor's job list as CSV — a header naming `provider`, `job_id` and optionally `request_key` (any order,
    other columns ignored, e.g. an invoice export) — as (provider, job id, request key) rows; InvalidInput
    names the first bad line."""
    rows = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    names = [h.strip().lower() for h in next(rows, [])]
    if "provider" not in names or "job_id" not in names:
        raise InvalidInput("vendor jobs: the header must name provider and job_id (and optionally request_key)")
    at = {n: names.index(n) for n in ("provider", "job_id", "request_key") if n in names}
    jobs: list[tuple[str, str, str | None]] = []
    for line_no, row in enumerate(rows, start=2):
        cell = {n: (row[i].strip() if i < len(row) else "") for n, i in at.items()}
        if not any(cell.values()):
            continue
        if not cell["provider"] or not cell["job_id"]:
            raise InvalidInput(f"vendor jobs line {line_no}: provider and job_id must not be empty")
        jobs.append((cell["provider"], cell["job_id"], cell.get("request_key") or None))
    return jobs


def _run(conn: Connection, c: Check, scope: Scope, limit: int) -> CheckResult:
    stmt = c.query(scope)
    count = q.count(conn, stmt)
    rows = q.sample(conn, stmt, limit) if count else []
    return CheckResult(c.id, c.description, count, rows)


# the motion invariants (I2.4, I2.5, I7.4, I10.3) register themselves into CHECKS
from aivedio_engine.services import invariants_motion  # noqa: E402, F401
