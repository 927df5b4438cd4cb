"""In-process slot store for embedded mode: the same contract as the Redis store, one lock, injected clock.

A lease is live while now < its expiry; expired members are purged before anything is counted, exactly as the
Redis scripts do, so the contract suite holds for both. The clock returns seconds (monotonic by default):
tests advance it instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

from aivedio_engine.slots.base import (
    DEFAULT_RESEED_GAP,
    Lease,
    RebuildReport,
    fence_of,
    holder_of,
    holders_by_scope_inverted,
    validate_chain,
)


class MemorySlotStore:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        fence_floor: Callable[[], int] | None = None,
        reseed_gap: int = DEFAULT_RESEED_GAP,
    ) -> None:
        self._clock = clock
        self._fence_floor = fence_floor
        self._gap = reseed_gap
        self._lock = threading.Lock()
        self._scopes: dict[str, dict[str, float]] = {}  # scope → token → expiry
        self._backed: set[str] = set()  # tokens the database has vouched for (see rebuild)
        self._fence: int | None = None  # None: never seeded, like a missing Redis key

    def acquire(self, scope_chain: Sequence[tuple[str, int]], holder: str, ttl_s: float) -> Lease | None:
        validate_chain(scope_chain)
        _check_ttl(ttl_s)
        with self._lock:
            now = self._clock()
            for scope, limit in scope_chain:
                if len(self._live(scope, now)) >= limit:
                    return None
            if self._fence is None:
                self._seed(self._fence_floor() if self._fence_floor else 0)
            assert self._fence is not None
            self._fence += 1
            lease = Lease(str(holder), self._fence, tuple(s for s, _ in scope_chain))
            for scope in lease.scopes:
                self._scopes.setdefault(scope, {})[lease.token] = now + ttl_s
            return lease

    def renew(self, lease: Lease, ttl_s: float) -> bool:
        _check_ttl(ttl_s)
        with self._lock:
            now = self._clock()
            if not self._is_live(lease, now):
                self._remove(lease.token, lease.scopes)
                return False
            for scope in lease.scopes:
                self._scopes[scope][lease.token] = now + ttl_s
            return True

    def release(self, lease: Lease) -> bool:
        with self._lock:
            live = self._is_live(lease, self._clock())
            self._remove(lease.token, lease.scopes)
            self._backed.discard(lease.token)
            return live

    def release_many(self, leases: Sequence[Lease]) -> int:
        return sum(self.release(lease) for lease in leases)

    def is_current(self, lease: Lease) -> bool:
        with self._lock:
            return self._is_live(lease, self._clock())

    def counts(self) -> dict[str, int]:
        with self._lock:
            return self._counts(self._clock())

    def current_fence(self) -> int:
        with self._lock:
            return self._fence or 0

    def seed_fence(self, floor: int) -> int:
        with self._lock:
            return self._seed(floor)

    def rebuild(self, active: Mapping[str, Sequence[str]], *, ttl_s: float, fence_floor: int = 0) -> RebuildReport:
        _check_ttl(ttl_s)
        want = holders_by_scope_inverted(active)
        with self._lock:
            now = self._clock()
            self._seed(fence_floor)
            assert self._fence is not None
            live: dict[str, dict[str, set[str]]] = {}  # holder → token → scopes it is live in
            for scope in list(self._scopes):
                for token in self._live(scope, now):
                    live.setdefault(holder_of(token), {}).setdefault(token, set()).add(scope)
            added: list[Lease] = []
            kept = dropped = 0
            for holder, tokens in live.items():
                wanted = want.get(holder)
                owner = _owner(tokens, wanted)
                if owner is not None and wanted is not None:
                    for scope in wanted:
                        self._scopes[scope][owner] = max(self._scopes[scope][owner], now + ttl_s)
                    self._backed.add(owner)
                    kept += 1
                # Only tokens the database once vouched for are dropped. A token it never saw may belong to a
                # dispatcher between acquire and its transaction; the TTL takes care of it if that one died.
                for token, live_in in tokens.items():
                    if token != owner and token in self._backed:
                        self._remove(token, live_in)
                        self._backed.discard(token)
                        dropped += 1
            for holder, scopes in want.items():
                if _owner(live.get(holder, {}), scopes) is None:
                    self._fence += 1
                    lease = Lease(holder, self._fence, scopes)
                    for scope in scopes:
                        self._scopes.setdefault(scope, {})[lease.token] = now + ttl_s
                    self._backed.add(lease.token)
                    added.append(lease)
            self._backed = {t for t in self._backed if any(t in m for m in self._scopes.values())}
            return RebuildReport(tuple(added), kept, dropped, self._counts(now))

    # -- under the lock ---------------------------------------------------------------------------------------

    def _live(self, scope: str, now: float) -> dict[str, float]:
        members = self._scopes.get(scope)
        if members is None:
            return {}
        for token in [t for t, exp in members.items() if exp <= now]:
            del members[token]
        if not members:
            del self._scopes[scope]
            return {}
        return members

    def _is_live(self, lease: Lease, now: float) -> bool:
        return all(lease.token in self._live(scope, now) for scope in lease.scopes)

    def _remove(self, token: str, scopes: Sequence[str] | set[str]) -> None:
        for scope in scopes:
            members = self._scopes.get(scope)
            if members is not None:
                members.pop(token, None)
                if not members:
                    del self._scopes[scope]

    def _counts(self, now: float) -> dict[str, int]:
        return {scope: n for scope in list(self._scopes) if (n := len(self._live(scope, now)))}

    def _seed(self, floor: int) -> int:
        if self._fence is None:
            self._fence = int(floor) + self._gap
        elif floor > self._fence:
            self._fence = int(floor)
        return self._fence


def _owner(tokens: Mapping[str, set[str]], wanted: Sequence[str] | None) -> str | None:
    """The holder's newest token that is live in every scope the database puts it in, if any."""
    if wanted is None:
        return None
    complete = [t for t, scopes in tokens.items() if set(wanted) <= scopes]
    return max(complete, key=fence_of) if complete else None


def _check_ttl(ttl_s: float) -> None:
    if not ttl_s > 0:
        raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
