"""The provider switch rule, row by row (domain/provider_switch.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal

import pytest

from aivedio_engine.domain.provider_switch import PROVIDER_SIDE, Offer, SwitchContext, Why, choose_provider
from aivedio_engine.domain.retry import ErrorClass

A = Offer("a", {"720p": Decimal("1")})
B = Offer("b", {"720p": Decimal("1")})
C = Offer("c", {"720p": Decimal("1")})
BASE = SwitchContext(
    current="a",
    offers=(A, B, C),
    resolution="720p",
    duration_s=5,
    reserved=Decimal("5"),
    pinned=False,
    budget_allows=True,
)


@dataclass(frozen=True)
class Row:
    name: str
    ctx: SwitchContext
    why: Why
    error: ErrorClass | None
    expected: str | None
    reason: str = ""


ROWS = [
    Row("breaker open: the next provider", BASE, Why.BREAKER_OPEN, None, "b"),
    Row("5xx: the next provider", BASE, Why.REJECTED, ErrorClass.PROVIDER_5XX_NOT_ACCEPTED, "b"),
    Row("connect failed", BASE, Why.REJECTED, ErrorClass.CONNECT_FAILED, "b"),
    Row("429", BASE, Why.REJECTED, ErrorClass.PROVIDER_RATE_LIMITED, "b"),
    Row("the order wraps around", replace(BASE, current="c"), Why.BREAKER_OPEN, None, "a"),
    Row("a refused prompt stays", BASE, Why.REJECTED, ErrorClass.PROVIDER_REJECTED, None, "not a provider-side"),
    Row("a local error stays", BASE, Why.REJECTED, ErrorClass.LOCAL_INVALID, None, "not a provider-side"),
    Row("an ambiguous submit never moves", BASE, Why.REJECTED, ErrorClass.SUBMIT_AMBIGUOUS, None, "not a provider"),
    Row(
        "unreconciled ambiguity blocks even a breaker move",
        replace(BASE, ambiguous_unresolved=True),
        Why.BREAKER_OPEN,
        None,
        None,
        "not reconciled",
    ),
    Row("budget off", replace(BASE, budget_allows=False), Why.BREAKER_OPEN, None, None, "provider_switch_allowed"),
    Row("the client named the provider", replace(BASE, pinned=True), Why.BREAKER_OPEN, None, None, "named"),
    Row(
        "the model may not leave its provider",
        replace(BASE, offers=(replace(A, switchable=False), B)),
        Why.BREAKER_OPEN,
        None,
        None,
        "may not move away",
    ),
    Row(
        "a provider the model may not move to is skipped",
        replace(BASE, offers=(A, replace(B, switchable=False), C)),
        Why.BREAKER_OPEN,
        None,
        "c",
    ),
    Row(
        "a provider whose breaker is open is skipped",
        replace(BASE, admitting=frozenset({"a", "c"})),
        Why.BREAKER_OPEN,
        None,
        "c",
    ),
    Row(
        "a dearer provider is skipped (never more than was reserved)",
        replace(BASE, offers=(A, Offer("b", {"720p": Decimal("1.01")}), C)),
        Why.BREAKER_OPEN,
        None,
        "c",
    ),
    Row(
        "a provider without the resolution is skipped",
        replace(BASE, offers=(A, Offer("b", {"1080p": Decimal("1")}), C)),
        Why.BREAKER_OPEN,
        None,
        "c",
    ),
    Row(
        "a cheaper provider is fine",
        replace(BASE, offers=(A, Offer("b", {"720p": Decimal("0.5")}))),
        Why.REJECTED,
        ErrorClass.CONNECT_FAILED,
        "b",
    ),
    Row("nobody else offers the model", replace(BASE, offers=(A,)), Why.BREAKER_OPEN, None, None, "no other"),
    Row(
        "every other provider is open",
        replace(BASE, admitting=frozenset({"a"})),
        Why.BREAKER_OPEN,
        None,
        None,
        "breaker is open",
    ),
    Row(
        "n outputs: never to a provider that makes fewer",
        replace(BASE, outputs=2, reserved=Decimal("10"), offers=(replace(A, max_outputs=2), B)),
        Why.BREAKER_OPEN,
        None,
        None,
        "at most 1 output(s), 2 were asked for",
    ),
    Row(
        "n outputs: the price counts every output",
        replace(
            BASE,
            outputs=2,
            reserved=Decimal("10"),
            offers=(A, replace(B, max_outputs=2, price_per_second={"720p": Decimal("1.5")})),
        ),
        Why.BREAKER_OPEN,
        None,
        None,
        "costs more than was reserved",
    ),
    Row(
        "n outputs: a provider making as many moves",
        replace(BASE, outputs=2, reserved=Decimal("10"), offers=(A, replace(B, max_outputs=4))),
        Why.BREAKER_OPEN,
        None,
        "b",
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_switch_table(row: Row) -> None:
    decision = choose_provider(row.ctx, row.why, row.error)
    assert decision.provider == row.expected, decision.reason
    assert row.reason in decision.reason


def test_provider_side_classes_are_exactly_the_healthy_request_failures() -> None:
    assert PROVIDER_SIDE == {
        ErrorClass.PROVIDER_5XX_NOT_ACCEPTED,
        ErrorClass.CONNECT_FAILED,
        ErrorClass.PROVIDER_RATE_LIMITED,
    }
