"""Admission, pure: which queued tasks to dispatch next under four nested concurrency limits.

The limits nest platform → tenant → provider → model: a task may start only when every one
of its four scopes has a free slot. Scope names are spelled here and nowhere else, because the slot store, the
slot reconciler and the dispatcher must all count the same thing under the same key.

Order of service:
- priority tiers are strict (a lower number is served first): a lower tier only gets what the
  higher tiers could not use — work-conserving, so a tier whose provider is full does not idle the platform;
- within a tier, tenants take turns (round-robin, one task per turn), so a tenant with 1,000 queued tasks does
  not make a tenant with 2 wait behind all of them. The turn order continues across calls through `cursor`,
  which the caller keeps and passes back (it is plain data; losing it only restarts the rotation);
- within a tenant, FIFO by `created_at`, then higher `priority`, then task id (a stable total order).
  The task's `priority` field orders only within equal timestamps; a task that must overtake older ones belongs
  in a higher tier — the dispatcher maps tenant plan and task kind to a tier.

`select()` plans one round from a snapshot; the slot store remains the authority. Each pick must still be
acquired (`SlotStore.acquire(limits.chain(...))`), and a refused acquire (another scheduler got there first)
simply leaves the task queued for the next round.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import IntEnum

PLATFORM_SCOPE = "platform"


def tenant_scope(tenant_id: str) -> str:
    return f"tenant:{tenant_id}"


def provider_scope(provider: str) -> str:
    return f"provider:{provider}"


def model_scope(provider: str, model: str) -> str:
    # a model name is only unique within its provider
    return f"model:{provider}/{model}"


def scope_names(tenant_id: str, provider: str, model: str) -> tuple[str, str, str, str]:
    """The four nested scopes of one task, outermost first."""
    return PLATFORM_SCOPE, tenant_scope(tenant_id), provider_scope(provider), model_scope(provider, model)


class PriorityTier(IntEnum):
    """The priority tiers of projects; a lower value is served first."""

    CUSTOM_PROJECT = 1
    PAID = 2
    PREVIEW = 3
    FREE_PREVIEW = 4
    CLEANUP = 5


_TIERS = frozenset(t.value for t in PriorityTier)


def capped_tier(requested: int, tenant_tier: int) -> int:
    """The tier a task is served in: the one its request asks for (`priority`; 0 = the tenant's own), but never
    a better one than its tenant's — a lower number is better, so the larger of the two wins. A tenant tier
    outside the seed's (rows written before migration 0012 held 0) counts as PAID."""
    tenant = tenant_tier if tenant_tier in _TIERS else PriorityTier.PAID
    return max(requested, tenant) if requested else int(tenant)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A QUEUED task as the scheduler sees it."""

    task_id: str
    tenant_id: str
    provider: str
    model: str
    created_at: datetime
    priority: int = 0
    tier: int = PriorityTier.PAID


@dataclass(frozen=True)
class Limits:
    """The four limits. Providers missing from `providers` get 0 slots (an unknown provider is never dispatched
    to); models missing from `models` are bounded by their provider only; tenants missing from `tenants` get
    `tenant_default`.

    `providers` should hold the *effective* capacity: min(configured max_concurrency, the AIMD estimate from
    `throttle`), so a provider answering 429 is given fewer slots before it is asked again.
    """

    platform: int
    tenant_default: int
    tenants: Mapping[str, int] = field(default_factory=dict)
    providers: Mapping[str, int] = field(default_factory=dict)
    #: keyed "provider/model"
    models: Mapping[str, int] = field(default_factory=dict)

    def tenant(self, tenant_id: str) -> int:
        return self.tenants.get(tenant_id, self.tenant_default)

    def provider(self, provider: str) -> int:
        return self.providers.get(provider, 0)

    def model(self, provider: str, model: str) -> int:
        return self.models.get(f"{provider}/{model}", self.provider(provider))

    def chain(self, tenant_id: str, provider: str, model: str) -> tuple[tuple[str, int], ...]:
        """(scope, limit) outermost first: the argument of `SlotStore.acquire`."""
        limits = (self.platform, self.tenant(tenant_id), self.provider(provider), self.model(provider, model))
        return tuple(zip(scope_names(tenant_id, provider, model), limits, strict=True))


@dataclass(frozen=True)
class Selection:
    picks: tuple[Candidate, ...]
    #: tier → the tenant served last in that tier; pass it to the next select() call.
    cursor: Mapping[int, str]
    #: the live counts the picks would produce (input counts + one per pick in each of its scopes).
    counts: Mapping[str, int]


def fifo_key(c: Candidate) -> tuple[datetime, int, str]:
    return c.created_at, -c.priority, c.task_id


def select(
    candidates: Iterable[Candidate],
    counts: Mapping[str, int],
    limits: Limits,
    *,
    max_picks: int,
    cursor: Mapping[int, str] | None = None,
    submit_budget: Mapping[str, int] | None = None,
) -> Selection:
    """Pick up to `max_picks` candidates that fit, in tier → tenant round-robin → FIFO order.

    `counts` are the live slot counts per scope (`SlotStore.counts()`). `submit_budget` caps how many new
    submits each provider may receive this round: 0 while its breaker is open or a Retry-After is pending, 1
    for a half-open breaker's probe; providers absent from it are uncapped.
    """
    working: Counter[str] = Counter(counts)
    budget = dict(submit_budget or {})
    turns = dict(cursor or {})
    picks: list[Candidate] = []

    def fits(c: Candidate) -> bool:
        if budget.get(c.provider, 1) <= 0:
            return False
        return all(working[scope] < limit for scope, limit in limits.chain(c.tenant_id, c.provider, c.model))

    by_tier: dict[int, dict[str, list[Candidate]]] = {}
    seen: set[str] = set()
    for c in candidates:
        if c.task_id in seen:  # a snapshot assembled from two queries may repeat a row
            continue
        seen.add(c.task_id)
        by_tier.setdefault(c.tier, {}).setdefault(c.tenant_id, []).append(c)

    for tier in sorted(by_tier):
        queues = {t: sorted(q, key=fifo_key) for t, q in by_tier[tier].items()}
        ring = deque(_rotation(queues, turns.get(tier)))
        while ring:
            if len(picks) >= max_picks or working[PLATFORM_SCOPE] >= limits.platform:
                return Selection(tuple(picks), turns, dict(working))
            tenant = ring.popleft()
            queue = queues[tenant]
            # the first task that fits, not only the head: one full provider must not block the tenant's
            # tasks for other providers. Counts only grow within a call, so a tenant with nothing that fits
            # now never will in this call and leaves the ring.
            chosen = next((i for i, c in enumerate(queue) if fits(c)), None)
            if chosen is None:
                continue
            c = queue.pop(chosen)
            picks.append(c)
            for scope in scope_names(c.tenant_id, c.provider, c.model):
                working[scope] += 1
            if c.provider in budget:
                budget[c.provider] -= 1
            turns[tier] = tenant
            if queue:
                ring.append(tenant)
    return Selection(tuple(picks), turns, dict(working))


def _rotation(queues: Mapping[str, list[Candidate]], last: str | None) -> list[str]:
    """Tenants in turn order: by id, starting after the tenant served last; with no history, from the tenant
    whose oldest task has waited longest."""
    tenants = sorted(queues)
    if last is None:
        first = min(tenants, key=lambda t: (fifo_key(queues[t][0]), t))
        start = tenants.index(first)
    else:
        # the last tenant may have no tasks left: start at the next id after it, wrapping around
        start = next((i for i, t in enumerate(tenants) if t > last), 0)
    return tenants[start:] + tenants[:start]


# --- load shedding -------------------------------------------------------------------------


def backlogged(oldest_due_age_s: float | None, limit_s: float) -> bool:
    """The broker path has stalled: an outbox row has been due for longer than `limit_s` (0 = never shed).
    Accepting more paid work then only grows a queue nobody drains, so new creates are refused until it moves."""
    return limit_s > 0 and oldest_due_age_s is not None and oldest_due_age_s > limit_s


def exempt_from_shedding(tier: int, exempt_up_to: int | None) -> bool:
    """Tiers up to `exempt_up_to` (a lower tier is more important) are still admitted while shedding."""
    return exempt_up_to is not None and tier <= exempt_up_to
