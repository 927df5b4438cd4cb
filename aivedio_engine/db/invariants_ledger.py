"""The ledger's invariants (I4) as queries of the offending rows, for `aivedio audit` (services.invariants).

Money is compared after rounding to the ledger's 8 decimals, so SQLite's binary floats cannot raise a false alarm.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import ColumnElement

from aivedio_engine.db import balances
from aivedio_engine.db.invariants import TERMINAL, Offenders, Scope, dupes
from aivedio_engine.db.tables import assets, credit_ledger, generation_tasks, task_attempts, tenants
from aivedio_engine.domain.retry import ErrorOutcome
from aivedio_engine.domain.status import AssetKind, AssetStatus, LedgerEntryType, TaskStatus

_t, _a, _l = generation_tasks.c, task_attempts.c, credit_ledger.c
LE = LedgerEntryType


def money_differs(a: Any, b: Any) -> ColumnElement[bool]:
    return sa.func.round(a - b, 8) != 0


def duplicate_business_keys(s: Scope) -> Offenders:
    return dupes(_l.business_key)


def unbalanced_reservations(s: Scope) -> Offenders:
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


def ledger_unlike_actual_cost(s: Scope) -> Offenders:
    total = sa.func.sum(_l.amount)
    return (
        sa.select(_t.id.label("task_id"), _t.status, _t.actual_cost, total.label("ledger_sum"))
        .select_from(generation_tasks.join(credit_ledger, _l.task_id == _t.id))
        .where(_t.status.in_(TERMINAL), _l.entry_type != LE.ADJUSTMENT.value)
        .group_by(_t.id, _t.status, _t.actual_cost)
        .having(money_differs(total, -sa.func.coalesce(_t.actual_cost, 0)))
    )


def negative_tenant_ledgers(s: Scope) -> Offenders:
    total = sa.func.sum(_l.amount)
    return sa.select(_l.tenant_id, total.label("ledger_sum")).group_by(_l.tenant_id).having(sa.func.round(total, 8) < 0)


def rows_of_another_tenant(s: Scope) -> Offenders:
    return (
        sa.select(_l.id.label("ledger_id"), _l.task_id, _l.tenant_id, _t.tenant_id.label("task_tenant_id"))
        .select_from(credit_ledger.join(generation_tasks, _t.id == _l.task_id))
        .where(_l.tenant_id != _t.tenant_id)
    )


def stale_balance_caches(s: Scope) -> Offenders:
    sums = sa.select(_l.tenant_id, sa.func.sum(_l.amount).label("total")).group_by(_l.tenant_id).subquery()
    ledger_sum = sa.func.coalesce(sums.c.total, 0)
    balance = balances.total_of(tenants.c.id)  # the sum of the tenant's stripes
    return (
        sa.select(tenants.c.id.label("tenant_id"), balance.label("credit_balance"), ledger_sum.label("ledger_sum"))
        .select_from(tenants.outerjoin(sums, sums.c.tenant_id == tenants.c.id))
        .where(money_differs(balance, ledger_sum))
    )


def closings_off_the_table(s: Scope) -> Offenders:
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
    capped = sa.case((bill < rows.c.reserved, bill), else_=rows.c.reserved)
    # a success charges at most the quoted price of the outputs it delivered (UNDELIVERED_OUTPUTS)
    delivered = _delivered_variants(s)
    cap = _t.estimated_cost * sa.func.coalesce(delivered.c.delivered, 0) / outputs
    succeeded = _t.status == TaskStatus.SUCCEEDED.value
    expected = sa.case(
        (last.c.vendor_billed.is_(False), 0),
        (sa.and_(succeeded, cap < capped), cap),
        else_=capped,
    )
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
            generation_tasks.join(rows, rows.c.task_id == _t.id)
            .outerjoin(last, sa.and_(last.c.task_id == _t.id, last.c.attempt_no == newest))
            .outerjoin(delivered, delivered.c.task_id == _t.id)
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


def _was_ready(asset: Any) -> ColumnElement[bool]:
    """READY now, or READY until a retention or a tenant purge deleted it on purpose (it was delivered)."""
    return sa.or_(
        asset.c.status == AssetStatus.READY.value,
        sa.and_(asset.c.status == AssetStatus.DELETED.value, asset.c.ready_at.is_not(None)),
    )


def _delivered_variants(s: Scope) -> Any:
    """(task_id, delivered): the variants of each task whose delivery derivatives are (or were) READY."""
    variant, derivative = assets.alias("variant"), assets.alias("derivative")
    has_profiles = [
        sa.exists().where(
            derivative.c.parent_asset_id == variant.c.id, derivative.c.profile == profile, _was_ready(derivative)
        )
        for profile in sorted(s.delivered_profiles)
    ]
    return (
        sa.select(variant.c.task_id, sa.func.count(sa.distinct(variant.c.output_index)).label("delivered"))
        .where(variant.c.kind == AssetKind.RAW_OUTPUT.value, _was_ready(variant), *has_profiles)
        .group_by(variant.c.task_id)
        .subquery()
    )


def charged_past_delivery(s: Scope) -> Offenders:
    """A closed task charged more than the quoted price of the variants it delivered: estimate ÷ n × delivered.
    The tenant's own decisions are left out, as the settlement table leaves them to the vendor's bill: a cancel
    (asked for: `cancel_requested_at`), the deadline it set running out before any output (EXPIRED), and a
    reviewer's reject of a delivered output."""
    delivered = _delivered_variants(s)
    charges = (
        sa.select(_l.task_id, (-sa.func.sum(_l.amount)).label("charged"))
        .where(_l.task_id.is_not(None), _l.entry_type != LE.ADJUSTMENT.value)
        .group_by(_l.task_id)
        .subquery()
    )
    requested = sa.func.coalesce(_t.params["n"].as_float(), 1.0)
    outputs = sa.func.coalesce(delivered.c.delivered, 0)
    allowed = _t.estimated_cost * outputs / requested
    return (
        sa.select(
            _t.id.label("task_id"),
            _t.status,
            _t.estimated_cost,
            requested.label("requested"),
            outputs.label("delivered"),
            charges.c.charged,
            allowed.label("allowed"),
        )
        .select_from(
            generation_tasks.join(charges, charges.c.task_id == _t.id).outerjoin(
                delivered, delivered.c.task_id == _t.id
            )
        )
        .where(
            _t.status.in_(TERMINAL),
            _t.status.not_in([TaskStatus.CANCELED.value, TaskStatus.EXPIRED.value]),
            _t.cancel_requested_at.is_(None),
            sa.func.coalesce(_t.last_error_class, "") != ErrorOutcome.REVIEW_REJECTED.value,
            _t.reserved_amount == 0,
            charges.c.charged - allowed > 0.000001,
        )
    )
