"""Consuming an outbox event exactly once in effect: the inbox helper and the event envelope.

Brokers deliver at least once, and duplicates can be *concurrent* (a relay republishing after a crash, a Redis
worker whose heartbeat lapsed). So the dedup row is inserted first, in the same short transaction as the effect:
on PostgreSQL a concurrent duplicate blocks on the uncommitted primary-key entry and then finds the conflict, so
"check, then act" can never run twice. Any exception rolls the dedup row back with the effect, so a redelivery
retries instead of being mistaken for a duplicate.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from aivedio_engine.db import inbox
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.session import write_tx
from aivedio_engine.testing.failpoints import failpoint

Outcome = Literal["processed", "duplicate"]
PROCESSED: Outcome = "processed"
DUPLICATE: Outcome = "duplicate"


class InvalidEnvelope(ValueError):
    """A message body that is not a valid envelope; retrying cannot fix it."""


@dataclass(frozen=True, slots=True)
class Envelope:
    """The broker message body: ids and a small summary, never large or secret data."""

    event_id: uuid.UUID
    event_type: str
    schema_version: int
    aggregate_id: uuid.UUID
    aggregate_version: int
    tenant_id: uuid.UUID | None
    trace_id: str | None
    causation_id: uuid.UUID | None
    occurred_at: datetime
    payload: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form, as carried in the Dramatiq message."""
        return {
            "event_id": str(self.event_id),
            "event_type": self.event_type,
            "schema_version": self.schema_version,
            "aggregate_id": str(self.aggregate_id),
            "aggregate_version": self.aggregate_version,
            "tenant_id": _str_or_none(self.tenant_id),
            "trace_id": self.trace_id,
            "causation_id": _str_or_none(self.causation_id),
            "occurred_at": self.occurred_at.isoformat(),
            "payload": self.payload,
        }

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Envelope:
        """Validate a received body; raises InvalidEnvelope naming the bad field."""
        if not isinstance(data, Mapping):
            raise InvalidEnvelope(f"envelope must be an object, not {type(data).__name__}")
        try:
            payload = data.get("payload") or {}
            if not isinstance(payload, dict):
                raise InvalidEnvelope("payload: must be an object")
            return cls(
                event_id=uuid.UUID(_required(data, "event_id")),
                event_type=str(_required(data, "event_type")),
                schema_version=int(_required(data, "schema_version")),
                aggregate_id=uuid.UUID(_required(data, "aggregate_id")),
                aggregate_version=int(_required(data, "aggregate_version")),
                tenant_id=_uuid_or_none(data.get("tenant_id")),
                trace_id=data.get("trace_id"),
                causation_id=_uuid_or_none(data.get("causation_id")),
                occurred_at=datetime.fromisoformat(_required(data, "occurred_at")),
                payload=payload,
            )
        except (TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, InvalidEnvelope):
                raise
            raise InvalidEnvelope(f"invalid envelope: {exc}") from None


def _required(data: Mapping[str, Any], key: str) -> Any:
    value = data.get(key)
    if value is None:
        raise InvalidEnvelope(f"{key}: missing")
    return value


def _uuid_or_none(value: Any) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(str(value))


def _str_or_none(value: uuid.UUID | None) -> str | None:
    return None if value is None else str(value)


def consume_once(
    engine: Engine,
    consumer_group: str,
    event_id: uuid.UUID,
    aggregate_id: uuid.UUID | None,
    fn: Callable[[Connection], str | None],
    now: datetime,
) -> Outcome:
    """Run `fn(conn)` at most once per (consumer_group, event_id), in one transaction with the dedup row.

    `fn` reads facts, decides, CAS-updates, appends state events and next outbox rows on `conn`; it must not make
    network calls. Its return value (if any) is kept as the inbox row's result digest, so an operator can see
    what the first delivery did. Returns "duplicate" when the event was already consumed: the caller acks.
    """
    # write_tx: on SQLite the write lock is taken up front, so read-decide-write cannot fail halfway on "locked"
    with write_tx(engine) as conn:
        if not inbox.claim(conn, consumer_group, event_id, aggregate_id, now):
            failpoint("consume.duplicate")
            return DUPLICATE
        digest = fn(conn)
        if digest:
            inbox.keep_digest(conn, consumer_group, event_id, digest)
        failpoint("consume.before_commit")
        failpoint(f"{consumer_group}.before_commit")
    failpoint(f"{consumer_group}.after_commit")
    return PROCESSED
