"""Settlement: what a closing task is charged, from the vendor's bill (settle by the vendor's
actual charging stage and release the difference).

One table decides every closing. Its inputs are the closing effect `decide()` put on the transition
(SETTLE_CREDITS, RELEASE_CREDITS, SETTLE_PER_BILLING_RULE, ABSORB_PROVIDER_COST), what the client was quoted at
creation, what the vendor reported on the job's terminal observation and, for a success, how many outputs were
delivered. Its output is the ledger rows to book and the platform cost: the part of the vendor's bill the tenant
does not pay because nothing (or not all) of it was delivered, through no doing of the tenant. Pure: everything is
an argument, amounts are `Decimal` quantized to the ledger's 8 decimals.

A success charges at most estimate ÷ n × delivered outputs: an output is delivered once its required
derivatives are READY, so a variant the vendor made and billed that never became playable is not the tenant's.

Sign convention (`services/billing.py`): RESERVE −estimate; SETTLE +(reserved − actual), i.e. the
released difference; RELEASE +reserved; REFUND +what the vendor gave back (never more than was charged);
ADJUSTMENT ±.

The price of a billed unit is the model's price list as quoted at creation: estimate / requested seconds /
requested outputs. A vendor that reports no units (Runway: usage per account only) leaves the price list ×
the requested seconds; `aivedio ledger reconcile` corrects that from the invoice. A bill above the reservation
is never charged past it: the excess is returned for an alert.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from enum import StrEnum

from aivedio_engine.domain.status import LedgerEntryType
from aivedio_engine.domain.transitions import Effect

QUANTUM = Decimal("0.00000001")
ZERO = Decimal(0)
CLOSING_EFFECTS = (
    Effect.SETTLE_CREDITS,
    Effect.RELEASE_CREDITS,
    Effect.SETTLE_PER_BILLING_RULE,
    Effect.ABSORB_PROVIDER_COST,
)


def money(value: Decimal) -> Decimal:
    return value.quantize(QUANTUM, rounding=ROUND_HALF_UP)


@dataclass(frozen=True, slots=True)
class Quote:
    """What the client was quoted and what is still held for it."""

    estimate: Decimal  # price list × requested seconds (× outputs)
    reserved: Decimal  # still held; 0 once the task was closed
    requested_seconds: int
    requested_outputs: int = 1


@dataclass(frozen=True, slots=True)
class Bill:
    """What the vendor reported for the job that decides the task's cost (its current attempt)."""

    billed: bool | None = None  # the vendor's verdict; None: it did not say
    seconds: Decimal | None = None  # output seconds billed
    outputs: int | None = None  # outputs billed
    refunded: bool = False  # the vendor gave the charge back (own moderation failure, voided job)

    @property
    def has_units(self) -> bool:
        return self.seconds is not None or self.outputs is not None


class Rule(StrEnum):
    """The rows of the table, in the order they are tried."""

    NOTHING_RESERVED = "nothing_reserved"  # nothing held (already closed, or free): no row
    NOT_CLOSING = "not_closing"  # the transition carries no credit effect: no row
    NO_PROVIDER_COST = "no_provider_cost"  # RELEASE_CREDITS: RELEASE all
    PLATFORM_COST = "platform_cost"  # ABSORB_PROVIDER_COST: RELEASE all, the vendor's bill is platform cost
    VENDOR_DID_NOT_BILL = "vendor_did_not_bill"  # the vendor said "not billed": RELEASE all
    NO_ACCEPTED_JOB = "no_accepted_job"  # per billing rule, no verdict, no job accepted: RELEASE all
    VENDOR_BILLED_NOTHING = "vendor_billed_nothing"  # units reported and they price to 0: RELEASE all
    VENDOR_REFUNDED = "vendor_refunded"  # charged, then refunded by the vendor: SETTLE + REFUND of the charge
    BILL_OVER_RESERVATION = "bill_over_reservation"  # the bill exceeds the reservation: SETTLE 0, alert
    BILLED_UNITS = "billed_units"  # price list × billed units: SETTLE the difference
    #: fewer outputs delivered than the bill covers: SETTLE estimate ÷ n × delivered, the rest platform cost
    UNDELIVERED_OUTPUTS = "undelivered_outputs"
    PRICE_LIST = "price_list"  # billed, no units reported: price list × requested seconds


@dataclass(frozen=True, slots=True)
class Settlement:
    rule: Rule
    #: the closing row: SETTLE, RELEASE, or None (nothing to book)
    entry: LedgerEntryType | None
    #: the closing row's amount: for SETTLE the released difference (reserved − charged), for RELEASE reserved
    amount: Decimal
    #: credits charged before any refund (capped at the reservation)
    charged: Decimal
    #: the price list × the vendor's billed units, uncapped; None when the vendor reported no units
    vendor_charge: Decimal | None
    #: how far the vendor's bill exceeds the reservation (> 0: record an alert; never charged)
    over_reservation: Decimal
    #: a REFUND row to book right after the closing row (the vendor already gave the charge back)
    refund: Decimal
    #: credits' worth of the vendor's bill that the platform bears (nothing, or not all, delivered); > 0: book it
    #: (a 0-credit ADJUSTMENT carrying the amount) and raise an alert
    platform_cost: Decimal = ZERO

    @property
    def actual(self) -> Decimal:
        """The task's cost net of refunds: what `generation_tasks.actual_cost` records."""
        return self.charged - self.refund


def vendor_charge(quote: Quote, bill: Bill) -> Decimal | None:
    """The model's price list applied to the vendor's billed units (None: no units reported)."""
    if not bill.has_units:
        return None
    charge = quote.estimate
    if bill.seconds is not None:
        charge = charge * bill.seconds / max(quote.requested_seconds, 1)
    if bill.outputs is not None:
        charge = charge * bill.outputs / max(quote.requested_outputs, 1)
    return money(charge)


def delivery_cap(quote: Quote, delivered: int) -> Decimal:
    """The most a success may charge: the quoted price of the outputs it delivered."""
    outputs = max(quote.requested_outputs, 1)
    return money(quote.estimate * min(max(delivered, 0), outputs) / outputs)


def settle(
    effects: tuple[Effect, ...] | frozenset[Effect],
    quote: Quote,
    bill: Bill,
    *,
    accepted: bool,
    delivered: int | None = None,
) -> Settlement:
    """The table: which rows close a reservation. `accepted`: some attempt of the task was accepted by the vendor
    (under the usual vendor rule an accepted job is billed even when it fails later). `delivered`: the outputs a
    success delivered (None: a closing that delivers nothing by the tenant's own decision, charged per the bill)."""
    reserved = quote.reserved

    def release(rule: Rule, platform_cost: Decimal = ZERO) -> Settlement:
        return Settlement(rule, LedgerEntryType.RELEASE, reserved, ZERO, None, ZERO, ZERO, platform_cost)

    if reserved <= 0:
        return Settlement(Rule.NOTHING_RESERVED, None, ZERO, ZERO, None, ZERO, ZERO)
    if Effect.RELEASE_CREDITS in effects:
        return release(Rule.NO_PROVIDER_COST)
    absorb = Effect.ABSORB_PROVIDER_COST in effects
    if not absorb and Effect.SETTLE_CREDITS not in effects and Effect.SETTLE_PER_BILLING_RULE not in effects:
        return Settlement(Rule.NOT_CLOSING, None, ZERO, ZERO, None, ZERO, ZERO)
    if bill.billed is False:
        return release(Rule.VENDOR_DID_NOT_BILL)
    if Effect.SETTLE_CREDITS not in effects and bill.billed is None and not accepted:
        return release(Rule.NO_ACCEPTED_JOB)
    priced = vendor_charge(quote, bill)
    if priced is not None and priced <= 0:
        return release(Rule.VENDOR_BILLED_NOTHING)
    bill_amount = quote.estimate if priced is None else priced
    if absorb:
        return release(Rule.PLATFORM_COST, ZERO if bill.refunded else bill_amount)
    chargeable = min(bill_amount, reserved)
    charged = chargeable if delivered is None else min(chargeable, delivery_cap(quote, delivered))
    over = max(bill_amount - reserved, ZERO)
    if charged < chargeable:
        rule = Rule.UNDELIVERED_OUTPUTS
    elif bill.refunded:
        rule = Rule.VENDOR_REFUNDED
    elif over > 0:
        rule = Rule.BILL_OVER_RESERVATION
    else:
        rule = Rule.PRICE_LIST if priced is None else Rule.BILLED_UNITS
    return Settlement(
        rule,
        LedgerEntryType.SETTLE,
        reserved - charged,
        charged,
        priced,
        over,
        charged if bill.refunded else ZERO,
        ZERO if bill.refunded else chargeable - charged,
    )


def refund_after_close(charged_net: Decimal, vendor_refund: Decimal | None = None) -> Decimal:
    """A vendor refund that arrives after the task was closed (a voided job, an invoice credit): the REFUND row's
    amount. `vendor_refund` None means the whole charge; never more than the task is still charged."""
    if charged_net <= 0:
        return ZERO
    wanted = charged_net if vendor_refund is None else money(vendor_refund)
    return max(min(wanted, charged_net), ZERO)


#: The table as docs/lifecycle.md and `aivedio audit` describe it: rule → (when, rows booked).
TABLE: dict[Rule, tuple[str, str]] = {
    Rule.NOTHING_RESERVED: ("nothing is held (already closed, or a free task)", "none"),
    Rule.NOT_CLOSING: ("the transition has no credit effect", "none"),
    Rule.NO_PROVIDER_COST: ("RELEASE_CREDITS (ended before any provider call)", "RELEASE +reserved"),
    Rule.PLATFORM_COST: (
        "ABSORB_PROVIDER_COST: ended without delivering, not by the tenant (vendor failure, our fetch, store, "
        "media or QC, a review SLA verdict)",
        "RELEASE +reserved; the vendor's bill (nothing if it refunded) as a 0-credit ADJUSTMENT, alert",
    ),
    Rule.VENDOR_DID_NOT_BILL: ("the vendor's verdict is 'not billed'", "RELEASE +reserved"),
    Rule.NO_ACCEPTED_JOB: ("per billing rule, no verdict, no attempt accepted", "RELEASE +reserved"),
    Rule.VENDOR_BILLED_NOTHING: ("the vendor billed 0 units", "RELEASE +reserved"),
    Rule.VENDOR_REFUNDED: ("billed, and the vendor refunded it", "SETTLE +(reserved−charged), REFUND +charged"),
    Rule.BILL_OVER_RESERVATION: ("price × billed units > reserved", "SETTLE +0 (capped), alert"),
    Rule.BILLED_UNITS: ("price × billed units ≤ reserved", "SETTLE +(reserved − price × units)"),
    Rule.UNDELIVERED_OUTPUTS: (
        "a success delivered fewer outputs than the bill covers",
        "SETTLE +(reserved − estimate ÷ n × delivered); the rest as a 0-credit ADJUSTMENT, alert",
    ),
    Rule.PRICE_LIST: ("billed, no units reported (Runway)", "SETTLE +(reserved − estimate)"),
}
