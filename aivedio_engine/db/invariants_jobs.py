"""Vendor jobs against our attempts (I3.5), for `aivedio audit` (services.invariants).

A job is known for a task when one of our attempts holds its id, or when the vendor's list names it with the
request key of one of our attempts. Each must be the job of one attempt or a recorded duplicate — the job id on
an attempt closed as never created, with its platform-cost row. Without the vendor's list (`Scope.vendor_jobs`:
the sim's ground truth in tests, an export of the vendor's jobs otherwise) only the recorded half is checked.
"""

from __future__ import annotations

import sqlalchemy as sa

from aivedio_engine.db.invariants import Offenders, Scope
from aivedio_engine.db.tables import credit_ledger, task_attempts
from aivedio_engine.domain.status import AttemptStatus, LedgerEntryType

_a, _l = task_attempts.c, credit_ledger.c
#: `billing.platform_cost_key(task, attempt, kind)` of the duplicate kind
_DUPLICATE_COST_KEY = "platform_cost:%:duplicate_paid_job"


def unaccounted_vendor_jobs(s: Scope) -> Offenders:
    """Recorded duplicates without their platform-cost row, and jobs on the vendor's list that carry one of our
    request keys while no attempt holds their id."""
    booked = sa.exists().where(
        _l.attempt_id == _a.id,
        _l.entry_type == LedgerEntryType.ADJUSTMENT.value,
        _l.business_key.like(_DUPLICATE_COST_KEY),
    )
    unbooked = sa.select(
        _a.task_id,
        _a.id.label("attempt_id"),
        _a.provider,
        _a.provider_job_id.label("job_id"),
        sa.literal("recorded duplicate without a platform-cost row").label("problem"),
    ).where(_a.submit_state == AttemptStatus.FAILED_BEFORE_ACCEPT.value, _a.provider_job_id.is_not(None), ~booked)
    if not s.vendor_jobs:
        return unbooked
    listed = (
        sa.values(sa.column("provider", sa.String), sa.column("job_id", sa.String), sa.column("request_key", sa.String))
        .data([tuple(j) for j in s.vendor_jobs])
        .alias("vendor_jobs")
    )
    holder = task_attempts.alias("holder")
    held = sa.exists().where(holder.c.provider == listed.c.provider, holder.c.provider_job_id == listed.c.job_id)
    unheld = (
        sa.select(
            _a.task_id,
            _a.id.label("attempt_id"),
            listed.c.provider,
            listed.c.job_id,
            sa.literal("a vendor job of this task that no attempt holds").label("problem"),
        )
        .select_from(listed)
        .join(task_attempts, sa.and_(_a.provider == listed.c.provider, _a.provider_request_key == listed.c.request_key))
        .where(~held)
    )
    both = sa.union_all(unbooked, unheld).subquery()
    return sa.select(both)
