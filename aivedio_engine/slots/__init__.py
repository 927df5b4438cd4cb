"""Concurrency slots: one Protocol (`base.SlotStore`), an in-process store and a Redis store, and the reconciler
that rebuilds them from PostgreSQL. The dispatcher protocol (acquire → record the fence → guarded submit →
release) is described in `base.py`."""

from __future__ import annotations

from collections.abc import Callable

from aivedio_engine.config import Settings
from aivedio_engine.slots.base import FenceUnavailable, Lease, RebuildReport, SlotStore, SlotStoreUnavailable
from aivedio_engine.slots.memory import MemorySlotStore


def build_slot_store(settings: Settings, fence_floor: Callable[[], int] | None = None) -> SlotStore:
    """Embedded mode: in-process; distributed mode: Redis. `fence_floor` is normally
    `lambda: reconcile.fence_floor(engine)`, read only when the fence counter has to be re-created."""
    if settings.mode == "distributed":
        from aivedio_engine.slots.redis import RedisSlotStore  # redis is only loaded when it is used

        return RedisSlotStore.from_url(
            settings.redis.url, key_prefix=settings.redis.key_prefix, fence_floor=fence_floor
        )
    return MemorySlotStore(fence_floor=fence_floor)


__all__ = [
    "FenceUnavailable",
    "Lease",
    "MemorySlotStore",
    "RebuildReport",
    "SlotStore",
    "SlotStoreUnavailable",
    "build_slot_store",
]
