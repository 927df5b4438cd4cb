"""The settlement table (domain/settlement.py), row by row: which ledger rows close a reservation, for every
closing effect and every kind of vendor bill. The amounts follow the sign convention of services/billing.py:
SETTLE +(reserved − charged), RELEASE +reserved, REFUND +what the vendor gave back."""

from __future__ import annotations

from decimal import Decimal

import pytest

from aivedio_engine.domain.settlement import (
    TABLE,
    Bill,
    Quote,
    Rule,
    refund_after_close,
    settle,
    vendor_charge,
)
from aivedio_engine.domain.status import LedgerEntryType
from aivedio_engine.domain.transitions import Effect

D = Decimal
LE = LedgerEntryType
SETTLE = (Effect.SETTLE_CREDITS,)
RELEASE = (Effect.RELEASE_CREDITS,)
PER_RULE = (Effect.SETTLE_PER_BILLING_RULE,)
#: 10 credits for 5 requested seconds: 2 credits per billed second
QUOTE = Quote(estimate=D("10"), reserved=D("10"), requested_seconds=5)


# rule, effects, bill, accepted → entry, closing amount, charged, refund, over the reservation
ROWS = [
    (Rule.NOTHING_RESERVED, SETTLE, Bill(billed=True), True, None, "0", "0", "0", "0"),
    (Rule.NOT_CLOSING, (Effect.NOTIFY,), Bill(), True, None, "0", "0", "0", "0"),
    (Rule.NO_PROVIDER_COST, RELEASE, Bill(billed=True, seconds=D(5)), True, LE.RELEASE, "10", "0", "0", "0"),
    (Rule.VENDOR_DID_NOT_BILL, PER_RULE, Bill(billed=False), True, LE.RELEASE, "10", "0", "0", "0"),
    (Rule.VENDOR_DID_NOT_BILL, SETTLE, Bill(billed=False, seconds=D(5)), True, LE.RELEASE, "10", "0", "0", "0"),
    (Rule.NO_ACCEPTED_JOB, PER_RULE, Bill(), False, LE.RELEASE, "10", "0", "0", "0"),
    (Rule.VENDOR_BILLED_NOTHING, SETTLE, Bill(billed=True, seconds=D(0)), True, LE.RELEASE, "10", "0", "0", "0"),
    # under-report: 3 of 5 seconds billed → 6 charged, 4 released with the SETTLE
    (Rule.BILLED_UNITS, SETTLE, Bill(billed=True, seconds=D(3)), True, LE.SETTLE, "4", "6", "0", "0"),
    (Rule.BILLED_UNITS, PER_RULE, Bill(seconds=D("2.5")), True, LE.SETTLE, "5", "5", "0", "0"),
    (Rule.BILLED_UNITS, SETTLE, Bill(billed=True, seconds=D(5)), True, LE.SETTLE, "0", "10", "0", "0"),
    # the per-rule close without a verdict trusts the vendor's units even when no attempt was marked accepted
    (Rule.BILLED_UNITS, PER_RULE, Bill(billed=True, seconds=D(1)), False, LE.SETTLE, "8", "2", "0", "0"),
    # over-report: 7 of 5 seconds → 14, capped at the 10 reserved; 4 over, for the alert
    (Rule.BILL_OVER_RESERVATION, SETTLE, Bill(billed=True, seconds=D(7)), True, LE.SETTLE, "0", "10", "0", "4"),
    # no units reported (Runway): the price list × the requested seconds
    (Rule.PRICE_LIST, SETTLE, Bill(billed=True), True, LE.SETTLE, "0", "10", "0", "0"),
    (Rule.PRICE_LIST, PER_RULE, Bill(), True, LE.SETTLE, "0", "10", "0", "0"),
    # charged, then refunded (vendor-side moderation failure): SETTLE of the charge and a REFUND of it
    (
        Rule.VENDOR_REFUNDED,
        PER_RULE,
        Bill(billed=True, seconds=D(4), refunded=True),
        True,
        LE.SETTLE,
        "2",
        "8",
        "8",
        "0",
    ),
    (Rule.VENDOR_REFUNDED, PER_RULE, Bill(billed=True, refunded=True), True, LE.SETTLE, "0", "10", "10", "0"),
]


@pytest.mark.parametrize(
    ("rule", "effects", "bill", "accepted", "entry", "amount", "charged", "refund", "over"),
    ROWS,
    ids=[f"{r[0].value}-{i}" for i, r in enumerate(ROWS)],
)
def test_each_row_of_the_table(
    rule: Rule,
    effects: tuple[Effect, ...],
    bill: Bill,
    accepted: bool,
    entry: LE | None,
    amount: str,
    charged: str,
    refund: str,
    over: str,
) -> None:
    quote = QUOTE if rule is not Rule.NOTHING_RESERVED else Quote(D("10"), D("0"), 5)
    got = settle(effects, quote, bill, accepted=accepted)
    assert (got.rule, got.entry) == (rule, entry)
    assert (got.amount, got.charged, got.refund, got.over_reservation) == (D(amount), D(charged), D(refund), D(over))
    # the ledger balances: reserve + closing row + refund = −(net cost)
    if entry is not None:
        assert -quote.reserved + got.amount + got.refund == -got.actual
    assert got.charged <= quote.reserved  # never charged past the reservation


ABSORB = (Effect.ABSORB_PROVIDER_COST,)
#: 30 credits for three outputs of 5 s: 10 credits an output
THREE = Quote(estimate=D("30"), reserved=D("30"), requested_seconds=5, requested_outputs=3)

# rule, effects, quote, bill, accepted, delivered → entry, closing amount, charged, platform cost
WHO_PAYS = [
    # nothing delivered, not the tenant's doing: everything released, the vendor's bill is ours
    (Rule.PLATFORM_COST, ABSORB, QUOTE, Bill(billed=True, seconds=D(5)), True, None, LE.RELEASE, "10", "0", "10"),
    (Rule.PLATFORM_COST, ABSORB, QUOTE, Bill(billed=True, seconds=D(2)), True, None, LE.RELEASE, "10", "0", "4"),
    (Rule.PLATFORM_COST, ABSORB, QUOTE, Bill(), True, None, LE.RELEASE, "10", "0", "10"),  # no units: price list
    # ... and nothing to bear when the vendor did not bill, or no job was ever accepted
    (Rule.VENDOR_DID_NOT_BILL, ABSORB, QUOTE, Bill(billed=False), True, None, LE.RELEASE, "10", "0", "0"),
    (Rule.NO_ACCEPTED_JOB, ABSORB, QUOTE, Bill(), False, None, LE.RELEASE, "10", "0", "0"),
    # a success charges only the outputs it delivered: 3 made and billed, 1 delivered → 10 charged, 20 ours
    (
        Rule.UNDELIVERED_OUTPUTS,
        SETTLE,
        THREE,
        Bill(billed=True, outputs=3),
        True,
        1,
        LE.SETTLE,
        "20",
        "10",
        "20",
    ),
    # the vendor billed one output of three and one was delivered: the bill decides, nothing is ours
    (Rule.BILLED_UNITS, SETTLE, THREE, Bill(billed=True, outputs=1), True, 1, LE.SETTLE, "20", "10", "0"),
    # every output delivered: the delivery cap changes nothing
    (Rule.BILLED_UNITS, SETTLE, THREE, Bill(billed=True, outputs=3), True, 3, LE.SETTLE, "0", "30", "0"),
    (Rule.PRICE_LIST, SETTLE, THREE, Bill(billed=True), True, 3, LE.SETTLE, "0", "30", "0"),
    # a reviewer's reject (delivered None): per the vendor's bill, as before
    (Rule.BILLED_UNITS, SETTLE, THREE, Bill(billed=True, outputs=3), True, None, LE.SETTLE, "0", "30", "0"),
]


@pytest.mark.parametrize(
    ("rule", "effects", "quote", "bill", "accepted", "delivered", "entry", "amount", "charged", "platform"),
    WHO_PAYS,
    ids=[f"{r[0].value}-{i}" for i, r in enumerate(WHO_PAYS)],
)
def test_who_pays_when_not_everything_was_delivered(
    rule: Rule,
    effects: tuple[Effect, ...],
    quote: Quote,
    bill: Bill,
    accepted: bool,
    delivered: int | None,
    entry: LE,
    amount: str,
    charged: str,
    platform: str,
) -> None:
    got = settle(effects, quote, bill, accepted=accepted, delivered=delivered)
    assert (got.rule, got.entry) == (rule, entry)
    assert (got.amount, got.charged, got.platform_cost) == (D(amount), D(charged), D(platform))
    assert -quote.reserved + got.amount + got.refund == -got.actual
    if delivered is not None:  # money follows delivery
        assert got.charged <= quote.estimate * delivered / quote.requested_outputs


def test_every_rule_is_a_row_of_the_documented_table_and_is_tested() -> None:
    assert set(TABLE) == set(Rule)
    assert {row[0] for row in ROWS} | {row[0] for row in WHO_PAYS} == set(Rule)


def test_price_per_unit_is_the_quoted_price_list() -> None:
    # 720p at 1.5 credits/s for 8 s = 12 reserved; the vendor billed 6.5 s → 9.75
    quote = Quote(estimate=D("12"), reserved=D("12"), requested_seconds=8)
    assert vendor_charge(quote, Bill(seconds=D("6.5"))) == D("9.75")
    # billed outputs scale the charge too (two outputs asked, one billed)
    two = Quote(estimate=D("20"), reserved=D("20"), requested_seconds=5, requested_outputs=2)
    assert vendor_charge(two, Bill(outputs=1)) == D("10")
    assert vendor_charge(quote, Bill(billed=True)) is None  # no units: no vendor charge
    # thirds are rounded to the ledger's 8 decimals
    odd = Quote(estimate=D("1"), reserved=D("1"), requested_seconds=3)
    assert vendor_charge(odd, Bill(seconds=D(1))) == D("0.33333333")


def test_a_reservation_smaller_than_the_estimate_caps_the_charge() -> None:
    got = settle(SETTLE, Quote(D("10"), D("6"), 5), Bill(billed=True, seconds=D(4)), accepted=True)
    assert (got.rule, got.charged, got.amount, got.over_reservation) == (Rule.BILL_OVER_RESERVATION, D(6), D(0), D(2))


@pytest.mark.parametrize(
    ("charged", "vendor_refund", "booked"),
    [
        ("10", None, "10"),  # a voided job: all of it
        ("10", "4", "4"),  # an invoice credit of 4
        ("10", "25", "10"),  # never more than the task is charged
        ("0", None, "0"),  # nothing charged: nothing to refund
        ("6", "-3", "0"),  # a negative refund is no refund
    ],
)
def test_refund_after_close(charged: str, vendor_refund: str | None, booked: str) -> None:
    assert refund_after_close(D(charged), None if vendor_refund is None else D(vendor_refund)) == D(booked)
