"""Sequences the money checker (tests/model/money.py) shrank to, replayed step by step on embedded SQLite: each
one failed once — on an engine with the defect its docstring names, or on a rule of the checker that misread the
settlement table — and must keep passing."""

from __future__ import annotations

from typing import Any

from tests.model import engine, money

Steps = list[tuple[str, dict[str, Any]]]


def _replay(steps: Steps) -> None:
    money.replay(engine.sqlite_database, steps)


def test_a_held_review_output_outliving_the_deadline_is_not_charged() -> None:
    """The deadline used to govern an output held in MANUAL_REVIEW: the sweeper expired it and the SETTLE kept the
    whole reservation (charged 8 for 0 received outputs, no platform cost booked), and `aivedio audit` was clean."""
    _replay(
        [
            ("tenants_", {"count": 1}),
            ("create_held_for_review", {"n": 2, "seconds": 4, "tenant": 0}),
            ("advance", {"seconds": 20}),
            ("advance", {"seconds": money.DEADLINE_S + 30}),
        ]
    )


def test_an_output_held_by_a_store_outage_past_the_deadline_is_not_charged() -> None:
    """The same over a store outage: the vendor's output waits in OUTPUT_FETCHING for our store, and the deadline
    used to expire it with the reservation kept (charged 1 for nothing, no platform cost)."""
    _replay(
        [
            ("tenants_", {"count": 1}),
            ("break_store", {}),
            ("create_held_for_review", {"n": 1, "seconds": 1, "tenant": 0}),
            ("advance", {"seconds": 60}),
            ("advance", {"seconds": money.DEADLINE_S + 30}),
        ]
    )


def test_a_deadline_before_any_output_is_charged_per_the_bill_and_the_audit_agrees() -> None:
    """The tenant's deadline running out before the vendor produced anything is the tenant's decision, charged per
    the bill (here the price list): audit I4.9 used to count it as charged past delivery, against the table."""
    _replay(
        [
            ("tenants_", {"count": 1}),
            ("create", {"n": 4, "seconds": 1, "tenant": 0}),
            ("advance", {"seconds": money.DEADLINE_S + 30}),
        ]
    )


def test_a_void_after_a_deadline_close_is_a_late_refund() -> None:
    """The vendor voids jobs whose tasks the deadline closed before any poll saw them finish (charged per the price
    list): a REFUND afterwards is the table's late refund, not a REFUND out of nowhere."""
    _replay(
        [
            ("tenants_", {"count": 2}),
            ("create", {"n": 4, "seconds": 2, "tenant": 1}),
            ("create", {"n": 1, "seconds": 3, "tenant": 0}),
            ("vendor_voids", {"pick": 9}),
            ("advance", {"seconds": money.DEADLINE_S + 30}),
            ("vendor_voids", {"pick": 47}),
            ("vendor_voids", {"pick": 2}),
            ("callbacks", {"how": "in_order"}),
        ]
    )


def test_a_bill_of_no_outputs_is_no_platform_cost() -> None:
    """The encoder refuses every output of a job the vendor billed as 0 outputs: the task fails, the reservation is
    released and there is no platform cost to book — the vendor's bill is worth nothing (VENDOR_BILLED_NOTHING)."""
    _replay(
        [
            ("tenants_", {"count": 1}),
            ("vendor_bills", {"factor": 0.5, "outputs": 0}),
            ("encoder", {"mode": "fails"}),
            ("create", {"n": 4, "seconds": 1, "tenant": 0}),
            ("advance", {"seconds": 20}),
            ("advance", {"seconds": 5}),
        ]
    )


def test_a_success_approved_with_one_of_two_variants_is_charged_for_one() -> None:
    """Output 1 never becomes playable (our encoder down past the media budget), a person approves output 0: the
    tenant pays estimate ÷ 2, the rest is platform cost. Without the settlement's delivery cap it paid for both."""
    _replay(
        [
            ("tenants_", {"count": 1}),
            ("encoder", {"mode": "flaky"}),
            ("create", {"n": 2, "seconds": 1, "tenant": 0}),
            ("advance", {"seconds": 20}),
            ("encoder", {"mode": "down"}),
            ("advance", {"seconds": 60}),
            ("advance", {"seconds": 60}),
            ("advance", {"seconds": 60}),
            ("approve", {"pick": 0}),
        ]
    )


def test_a_refund_reported_while_the_output_is_held_is_not_lost() -> None:
    """The vendor voids (refunds) a finished job while our store is down and its output waits to be fetched; the
    callback saying so arrives before the task ends. The refund was dropped as a repeated status, so the success
    that followed charged the tenant in full for a job the vendor had given back, and the audit was clean."""
    _replay(
        [
            ("tenants_", {"count": 1}),
            ("create", {"n": 1, "seconds": 1, "tenant": 0}),
            ("break_store", {}),
            ("advance", {"seconds": 60}),
            ("vendor_voids", {"pick": 0}),
        ]
    )
