"""Moving a task to another provider offering its model (the rule: `domain.provider_switch`).

The dispatcher asks `reroute` for tasks whose provider's breaker is open; the submit step asks `after_rejection`
when a provider refused a submit for a provider-side reason. Both only choose: the caller records the new
provider in `selected_provider` with the transition it applies anyway, so a move is in the task's history.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from aivedio_engine.config import Settings
from aivedio_engine.db import switching
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.domain import admission
from aivedio_engine.domain.breaker import BreakerState
from aivedio_engine.domain.provider_switch import Offer, SwitchContext, SwitchDecision, Why, choose_provider
from aivedio_engine.domain.retry import ErrorClass, Step
from aivedio_engine.providers.registry import model_limits
from aivedio_engine.services.provider_health import Health


def offers(settings: Settings, model: str) -> tuple[Offer, ...]:
    """The enabled providers offering `model`, in configured order."""
    out = []
    for name, provider in settings.providers.items():
        entry = provider.models.get(model)
        if provider.enabled and entry is not None:
            most = min(entry.max_outputs, model_limits(provider, model).max_outputs)
            out.append(Offer(name, dict(entry.price_per_second), entry.provider_switch, most))
    return tuple(out)


def context(
    settings: Settings, current: str, facts: switching.SwitchFacts, admitting: frozenset[str] | None
) -> SwitchContext:
    p = facts.params
    return SwitchContext(
        current=current,
        offers=offers(settings, str(p.get("model"))),
        resolution=str(p.get("resolution")),
        duration_s=int(p.get("duration_s") or 0),
        outputs=int(p.get("n") or 1),
        reserved=facts.reserved,
        # tasks stored before the flag existed are treated as pinned: nobody agreed to a move for them
        pinned=bool(p.get("provider_pinned", True)),
        budget_allows=settings.retry.budget(Step.SUBMIT).provider_switch_allowed,
        ambiguous_unresolved=facts.ambiguous_unresolved,
        admitting=admitting,
    )


def reroute(
    engine: Engine, settings: Settings, candidates: Sequence[admission.Candidate], health: Health, now: datetime
) -> list[admission.Candidate]:
    """Candidates of a provider whose breaker is open, moved to the next provider that may take them."""
    open_now = {name for name, b in health.breakers.items() if b.status(now) is BreakerState.OPEN}
    stuck = [uuid.UUID(c.task_id) for c in candidates if c.provider in open_now]
    if not stuck:
        return list(candidates)
    admitting = frozenset(health.breakers) - open_now
    with engine.connect() as conn:
        known = switching.facts(conn, stuck)
    out = []
    for cand in candidates:
        facts = known.get(uuid.UUID(cand.task_id)) if cand.provider in open_now else None
        if facts is not None:
            moved = choose_provider(context(settings, cand.provider, facts, admitting), Why.BREAKER_OPEN).provider
            if moved is not None:
                cand = replace(cand, provider=moved)
        out.append(cand)
    return out


def after_rejection(
    conn: Connection, settings: Settings, task_id: uuid.UUID, current: str, error: ErrorClass
) -> SwitchDecision:
    """Where the retry of a rejected submit should go (None: the same provider). Runs in the caller's transaction."""
    facts = switching.facts(conn, [task_id]).get(task_id)
    if facts is None:
        return SwitchDecision(None, "task not found")
    return choose_provider(context(settings, current, facts, None), Why.REJECTED, error)
