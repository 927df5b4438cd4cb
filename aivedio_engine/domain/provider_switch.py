"""May a task move to another provider offering the same model? Pure (`provider_switch_allowed`).

Two things make a move worth it: the task's provider has an open circuit breaker (the dispatcher would leave the
task waiting), or its submit was rejected for a reason on the provider's side (5xx, connection failure, 429).
A refusal of the request itself (4xx, moderation) is never a reason: another vendor would be asked to make what
the first one refused, and a local error fails everywhere.

A move needs every party's consent:
- the submit step's budget (`[retry.submit] provider_switch_allowed`),
- the client, who did not name the provider in the request (a named provider is a pinned one),
- the model's entry on both providers (`[providers.X.models.M] provider_switch`),
- the reservation: the new provider's price for the task may not exceed what was reserved, so a move never
  costs the tenant more than the estimate it was shown.
And never after an ambiguous submit that is not reconciled yet: the first provider may be running the job, and
a second provider would make a second paid job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum

from aivedio_engine.domain.retry import ErrorClass

#: rejections that say the provider, not the request, is the problem
PROVIDER_SIDE: frozenset[ErrorClass] = frozenset(
    {ErrorClass.PROVIDER_5XX_NOT_ACCEPTED, ErrorClass.CONNECT_FAILED, ErrorClass.PROVIDER_RATE_LIMITED}
)


class Why(StrEnum):
    BREAKER_OPEN = "breaker_open"
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class Offer:
    """One enabled provider offering the task's model."""

    provider: str
    price_per_second: Mapping[str, Decimal]
    #: the model's entry on this provider lets tasks move to and from it
    switchable: bool = True
    #: outputs (`n`) the model makes on this provider for one request
    max_outputs: int = 1


@dataclass(frozen=True, slots=True)
class SwitchContext:
    current: str
    #: the providers offering the task's model, in configured order (the current one included)
    offers: tuple[Offer, ...]
    resolution: str
    duration_s: int
    reserved: Decimal
    pinned: bool
    budget_allows: bool
    #: an attempt of this task ended ambiguous and is not reconciled
    ambiguous_unresolved: bool = False
    #: providers that would accept a submit now (breaker closed or probing); None: not known, assume all
    admitting: frozenset[str] | None = None
    #: outputs the request asked for (`n`)
    outputs: int = 1


@dataclass(frozen=True, slots=True)
class SwitchDecision:
    provider: str | None  # None: stay
    reason: str


def choose_provider(ctx: SwitchContext, why: Why, error: ErrorClass | None = None) -> SwitchDecision:
    """The provider the task should move to, or None with the reason it stays."""
    if why is Why.REJECTED and error not in PROVIDER_SIDE:
        return SwitchDecision(None, f"{error} is not a provider-side failure")
    if ctx.ambiguous_unresolved:
        return SwitchDecision(None, "an ambiguous submit is not reconciled yet")
    if not ctx.budget_allows:
        return SwitchDecision(None, "provider_switch_allowed is off for the submit step")
    if ctx.pinned:
        return SwitchDecision(None, "the request named its provider")
    names = [o.provider for o in ctx.offers]
    current = next((o for o in ctx.offers if o.provider == ctx.current), None)
    if current is not None and not current.switchable:
        return SwitchDecision(None, f"the model may not move away from {ctx.current}")
    start = names.index(ctx.current) + 1 if ctx.current in names else 0
    refused: list[str] = []
    for offer in ctx.offers[start:] + ctx.offers[:start]:  # the next one after the current, wrapping around
        if offer.provider == ctx.current:
            continue
        problem = _unfit(ctx, offer)
        if problem is None:
            return SwitchDecision(offer.provider, f"{why}: {ctx.current} -> {offer.provider}")
        refused.append(f"{offer.provider}: {problem}")
    return SwitchDecision(None, "no other provider fits" + (f" ({'; '.join(refused)})" if refused else ""))


def _unfit(ctx: SwitchContext, offer: Offer) -> str | None:
    if not offer.switchable:
        return "the model may not move to it"
    if ctx.admitting is not None and offer.provider not in ctx.admitting:
        return "its breaker is open"
    price = offer.price_per_second.get(ctx.resolution)
    if price is None:
        return f"no {ctx.resolution} price"
    if ctx.outputs > offer.max_outputs:  # it would deliver fewer outputs than were asked for and reserved
        return f"it makes at most {offer.max_outputs} output(s), {ctx.outputs} were asked for"
    if price * ctx.duration_s * ctx.outputs > ctx.reserved:
        return "it costs more than was reserved"
    return None
