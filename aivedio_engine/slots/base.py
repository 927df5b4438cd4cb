"""The slot store: concurrency slots as leases with TTL and fencing tokens.

A lease holds one slot in each scope of a nested chain (platform → tenant → provider → model, see
`domain.admission.scope_names`), granted atomically: either every scope had room or nothing was taken. Each
grant gets a fence from a counter that only grows. A lease is identified by its token, `"{fence}:{holder}"`;
renew and release are compare-and-set on that token, so a holder whose lease expired (GC pause, partition)
can neither renew it nor release the slot a newer holder was given — the newer lease has a newer fence.

The store is soft admission; PostgreSQL is the truth. The slot reconciler (`slots.reconcile`) periodically
calls `rebuild()` with the in-flight attempts: it refreshes the leases the database vouches for, re-creates
the ones that were lost (Redis flushed, sweeper down longer than the TTL), and drops the ones whose attempt
has ended. A lease acquired but not yet recorded in the database is left alone — it is in the short window
between `acquire` and the dispatcher's transaction — and simply expires if that dispatcher died.

Fence counter durability: if the counter is found missing (Redis flushed or restarted without persistence, a
fresh in-process store), it is re-created at `floor + reseed_gap`, where the floor comes from the database (the
largest fence recorded, see `reconcile.fence_floor`). The gap covers fences issued after the last one the
database saw, so a fence is never issued twice.

How the engine uses a lease (the dispatcher's protocol):
1. holder = the attempt id, generated *before* acquiring; `lease = store.acquire(limits.chain(...), holder,
   ttl_s)`; None → leave the task QUEUED for a later round.
2. Transaction A inserts the attempt with `fencing_token = lease.fence`. From its commit on, the reconciler
   keeps the lease alive for as long as the attempt is in flight; the dispatcher need not renew during
   polling (no single process follows an attempt for minutes). It renews only if its own work between
   acquire and the submit might outlast the TTL.
3. Before calling the provider, the SENDING transition is guarded:
   `UPDATE task_attempts SET submit_state='SENDING' ... WHERE id=:attempt AND fencing_token <= :fence`
   (the reconciler raises an attempt's token when it re-creates a lost lease, so a dispatcher paused past
   its TTL finds 0 rows and must not submit). `is_current(lease)` is the cheap pre-check; the guarded write
   is the authority, because the store can be flushed.
4. When the attempt reaches a terminal state, release it: `store.release(Lease.of(attempt_id,
   attempt.fencing_token, scopes))` — the lease is rebuilt from the row, so any process applying the
   terminal transition can release it. A False result is normal (already released, expired, or superseded);
   a missed release costs at most one reconcile interval, after which the slot is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

#: fences skipped when a lost counter is re-created; far more than the grants of one reconcile interval.
DEFAULT_RESEED_GAP = 1_000_000


@dataclass(frozen=True, slots=True)
class Lease:
    holder: str
    fence: int
    scopes: tuple[str, ...]

    @property
    def token(self) -> str:
        return f"{self.fence}:{self.holder}"

    @classmethod
    def of(cls, holder: str, fence: int, scopes: Sequence[str]) -> Lease:
        """The lease a database row refers to (holder = attempt id, fence = its fencing_token)."""
        return cls(str(holder), int(fence), tuple(scopes))


def holder_of(token: str) -> str:
    return token.split(":", 1)[1]


def fence_of(token: str) -> int:
    return int(token.split(":", 1)[0])


@dataclass(frozen=True)
class RebuildReport:
    #: leases re-created because the database has the attempt in flight but the store had no lease for it
    added: tuple[Lease, ...] = ()
    #: leases confirmed by the database and refreshed
    kept: int = 0
    #: leases the database no longer vouches for (attempt ended) or left incomplete across scopes
    dropped: int = 0
    #: live counts per scope after the rebuild
    counts: Mapping[str, int] = field(default_factory=dict)


class SlotStoreUnavailable(RuntimeError):
    """The store cannot be reached (Redis down): its counts are unknown. The dispatcher then degrades
    (`services/dispatch_degraded.py`); nothing that already holds a slot is affected, the database is the truth."""


class FenceUnavailable(RuntimeError):
    """The fence counter is missing and could not be re-created; no lease may be granted without a fence."""


@runtime_checkable
class SlotStore(Protocol):
    def acquire(self, scope_chain: Sequence[tuple[str, int]], holder: str, ttl_s: float) -> Lease | None:
        """One slot in every scope, atomically, or None when any scope is at its limit."""
        ...

    def renew(self, lease: Lease, ttl_s: float) -> bool:
        """Extend a live lease to now + ttl_s; False (and nothing extended) if it expired or was superseded."""
        ...

    def release(self, lease: Lease) -> bool:
        """Free the lease's slots; True only if it was still live. Never frees another lease."""
        ...

    def release_many(self, leases: Sequence[Lease]) -> int:
        """`release` of each lease, in one exchange with the store; returns how many were still live."""
        ...

    def is_current(self, lease: Lease) -> bool:
        """Is the lease still live in all its scopes?"""
        ...

    def counts(self) -> dict[str, int]:
        """Live leases per scope (scopes with none are omitted)."""
        ...

    def rebuild(self, active: Mapping[str, Sequence[str]], *, ttl_s: float, fence_floor: int = 0) -> RebuildReport:
        """Reconcile with the database: `active` maps each scope to the holders (attempt ids) in flight in it."""
        ...

    def current_fence(self) -> int:
        """The last fence issued (0 if the counter is missing)."""
        ...

    def seed_fence(self, floor: int) -> int:
        """Raise the counter to at least `floor` (re-create it at floor + gap if missing); returns it."""
        ...


def validate_chain(scope_chain: Sequence[tuple[str, int]]) -> None:
    names = [s for s, _ in scope_chain]
    if not names:
        raise ValueError("a lease needs at least one scope")
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate scope in chain: {names}")


def holders_by_scope_inverted(active: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """scope → holders, as the reconciler reads it, turned into holder → its scopes (in first-seen order)."""
    out: dict[str, list[str]] = {}
    for scope, holders in active.items():
        for h in holders:
            scopes = out.setdefault(str(h), [])
            if scope not in scopes:
                scopes.append(scope)
    return {h: tuple(s) for h, s in out.items()}
