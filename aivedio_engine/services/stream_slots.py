"""Caps on the open event streams of one API process ("connection caps").

Every SSE stream holds a socket, a notifier subscription and a database read per wake-up, so an unbounded number
of them is an unbounded cost: each API process admits at most `api.sse_max_streams` streams, and at most
`api.sse_max_streams_per_tenant` of one tenant, so that one tenant's dashboard left open in a thousand tabs cannot
take every other tenant's streams. A stream beyond either cap is refused before it starts (429 `too-many-streams`
with Retry-After), never by closing one that is already open.

The counts are per process on purpose: a stream is a local resource (this process's sockets and memory), and a
shared counter would leak a slot for every process that dies holding one. With N API processes behind a balancer
a tenant may hold up to N × the per-tenant cap; size the cap for that.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field

from aivedio_engine.services.errors import TooManyStreams


@dataclass
class StreamSlot:
    """One admitted stream; `release()` is idempotent, so every way a stream can end may call it."""

    tenant_id: uuid.UUID
    _slots: StreamSlots
    _released: bool = field(default=False)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._slots._release(self.tenant_id)


class StreamSlots:
    def __init__(self, max_streams: int, max_per_tenant: int, retry_after_s: int) -> None:
        self.max_streams = max_streams
        self.max_per_tenant = max_per_tenant
        self.retry_after_s = retry_after_s
        #: streams evicted for not reading (the operations surface and the tests read it)
        self.evicted = 0
        self._lock = threading.Lock()
        self._open = 0
        self._by_tenant: dict[uuid.UUID, int] = {}

    def acquire(self, tenant_id: uuid.UUID) -> StreamSlot:
        """A slot for one more stream of `tenant_id`, or TooManyStreams when a cap is reached."""
        with self._lock:
            mine = self._by_tenant.get(tenant_id, 0)
            if mine >= self.max_per_tenant:
                raise TooManyStreams(
                    f"this tenant already has {mine} open event streams on this server (the most is "
                    f"{self.max_per_tenant}); close one or retry in {self.retry_after_s} s",
                    retry_after_s=self.retry_after_s,
                )
            if self._open >= self.max_streams:
                raise TooManyStreams(
                    f"this server has {self._open} open event streams, its most; retry in {self.retry_after_s} s",
                    retry_after_s=self.retry_after_s,
                )
            self._open += 1
            self._by_tenant[tenant_id] = mine + 1
        return StreamSlot(tenant_id, self)

    def open(self, tenant_id: uuid.UUID | None = None) -> int:
        """Streams open now, in this process (for one tenant, or all)."""
        with self._lock:
            return self._open if tenant_id is None else self._by_tenant.get(tenant_id, 0)

    def note_evicted(self) -> None:
        with self._lock:
            self.evicted += 1

    def _release(self, tenant_id: uuid.UUID) -> None:
        with self._lock:
            self._open -= 1
            left = self._by_tenant.get(tenant_id, 0) - 1
            if left > 0:
                self._by_tenant[tenant_id] = left
            else:
                self._by_tenant.pop(tenant_id, None)
