"""Client webhooks (the notification gateway): endpoints, fan-out, the delivery log, replay.

Every applied task transition already leaves a `task.status.changed` outbox row (the SSE streams' trigger).
Its consumer also calls `fan_out`, which, once per event (inbox dedup), writes one delivery row per matching
endpoint of the task's tenant and one `webhook.delivery.requested` outbox row per delivery, in one transaction.
The delivery itself (an HTTP call) happens in `webhook_delivery.py`, outside any transaction, one delivery per
message, so a slow endpoint only ever holds the worker threads of its own deliveries.

A secret is returned once, at creation or rotation, and never listed again.
"""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.db import outbox
from aivedio_engine.db import webhooks as repo
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.session import read_conn, write_tx
from aivedio_engine.domain import webhooks as rules
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.status import WebhookDeliveryState
from aivedio_engine.fetch.egress import check_destination
from aivedio_engine.fetch.policy import PolicyError
from aivedio_engine.services.consume import Envelope, consume_once
from aivedio_engine.services.errors import InvalidInput, NotFound
from aivedio_engine.services.operations import Operation, record

CONSUMER_GROUP = "webhooks.fanout"
MAX_URL_CHARS = 2048
#: live endpoints one tenant may have: each status change costs one delivery per endpoint
MAX_ENDPOINTS_PER_TENANT = 20
log = structlog.get_logger("aivedio.webhooks")


@dataclass(frozen=True, slots=True)
class EndpointView:
    id: uuid.UUID
    tenant_id: uuid.UUID
    url: str
    events: tuple[str, ...]
    created_at: datetime
    #: while a rotation's grace period runs, the old secret signs too, until then
    previous_secret_until: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "tenant_id": str(self.tenant_id),
            "url": self.url,
            "events": list(self.events) or ["*"],
            "created_at": self.created_at.isoformat(),
            "previous_secret_until": self.previous_secret_until and self.previous_secret_until.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class WithSecret:
    endpoint: EndpointView
    #: shown once; the receiver verifies signatures with it
    secret: str


def _view(e: repo.Endpoint, now: datetime | None = None) -> EndpointView:
    until = e.previous_secret_until
    if until is not None and now is not None and until <= now:
        until = None
    return EndpointView(e.id, e.tenant_id, e.url, e.event_filter, e.created_at, until)


def delivery_json(d: repo.Delivery) -> dict[str, Any]:
    def iso(v: datetime | None) -> str | None:
        return None if v is None else v.isoformat()

    return {
        "id": str(d.id),
        "endpoint_id": str(d.endpoint_id),
        "tenant_id": str(d.tenant_id),
        "event_id": str(d.event_id),
        "event_type": d.event_type,
        "task_id": str(d.task_id),
        "status": d.payload.get("data", {}).get("status"),
        "version": d.payload.get("data", {}).get("version"),
        "state": d.state,
        "attempts": d.attempts,
        "next_attempt_at": iso(d.next_attempt_at) if d.state in repo.RETRYABLE else None,
        "last_attempt_at": iso(d.last_attempt_at),
        "last_status_code": d.last_status_code,
        "last_error": d.last_error,
        "delivered_at": iso(d.delivered_at),
        "created_at": iso(d.created_at),
    }


class WebhookService:
    def __init__(self, engine: Engine, clock: Clock, settings: Settings) -> None:
        self._engine = engine
        self._clock = clock
        self._settings = settings.client_webhooks

    # --- endpoints --------------------------------------------------------------------------------------------

    def tenant_id(self, ref: str) -> uuid.UUID:
        with read_conn(self._engine) as conn:
            found = repo.tenant_id_by_ref(conn, ref)
        if found is None:
            raise NotFound(f"tenant {ref!r} not found")
        return found

    def add(
        self, tenant_id: uuid.UUID, url: str, events: list[str] | None = None, op: Operation | None = None
    ) -> WithSecret:
        """Register an endpoint; `op` (an operator's CLI action) is audited, never with the secret."""
        url = url.strip()
        if not url or len(url) > MAX_URL_CHARS:
            raise InvalidInput(f"url: 1-{MAX_URL_CHARS} characters", field="url")
        try:
            check_destination(url, allow_private=self._settings.allow_private_networks)
        except PolicyError as exc:
            raise InvalidInput(f"url: {exc}", field="url") from None
        try:
            event_filter = rules.parse_event_filter(events or [])
        except ValueError as exc:
            raise InvalidInput(f"events: {exc}", field="events") from None
        secret = rules.new_secret(secrets.token_bytes(rules.SECRET_BYTES))
        now = self._clock.now()
        with write_tx(self._engine) as conn:
            if repo.tenant_id_by_ref(conn, str(tenant_id)) is None:
                raise NotFound(f"tenant {tenant_id} not found")
            if len(repo.list_endpoints(conn, tenant_id)) >= MAX_ENDPOINTS_PER_TENANT:
                raise InvalidInput(f"a tenant may have at most {MAX_ENDPOINTS_PER_TENANT} webhook endpoints")
            endpoint = repo.add_endpoint(conn, tenant_id, url, event_filter, secret, now)
            if op is not None:
                record(conn, op, affected_ids=[tenant_id, endpoint.id], outcome="created", now=now)
        return WithSecret(_view(endpoint), secret)

    def list_endpoints(self, tenant_id: uuid.UUID | None) -> list[EndpointView]:
        now = self._clock.now()
        with read_conn(self._engine) as conn:
            return [_view(e, now) for e in repo.list_endpoints(conn, tenant_id)]

    def get(self, tenant_id: uuid.UUID | None, endpoint_id: uuid.UUID) -> EndpointView:
        with read_conn(self._engine) as conn:
            return _view(self._owned(conn, tenant_id, endpoint_id), self._clock.now())

    def remove(self, tenant_id: uuid.UUID | None, endpoint_id: uuid.UUID, op: Operation | None = None) -> EndpointView:
        """Stop sending to the endpoint; its pending deliveries become DEAD when their next attempt comes."""
        now = self._clock.now()
        with write_tx(self._engine) as conn:
            endpoint = self._owned(conn, tenant_id, endpoint_id, lock=True)
            repo.remove_endpoint(conn, endpoint.id, now)
            if op is not None:
                record(conn, op, affected_ids=[endpoint.tenant_id, endpoint.id], outcome="removed", now=now)
        return _view(endpoint)

    def rotate(self, tenant_id: uuid.UUID | None, endpoint_id: uuid.UUID, op: Operation | None = None) -> WithSecret:
        """A new secret signs from now on; the old one also signs for `rotation_grace_s` (two signatures)."""
        now = self._clock.now()
        secret = rules.new_secret(secrets.token_bytes(rules.SECRET_BYTES))
        with write_tx(self._engine) as conn:
            endpoint = self._owned(conn, tenant_id, endpoint_id, lock=True)
            rotated = repo.rotate_secret(
                conn, endpoint, secret, now + timedelta(seconds=self._settings.rotation_grace_s), now
            )
            if op is not None:
                record(conn, op, affected_ids=[endpoint.tenant_id, endpoint.id], outcome="rotated", now=now)
        return WithSecret(_view(rotated, now), secret)

    def _owned(
        self, conn: Connection, tenant_id: uuid.UUID | None, endpoint_id: uuid.UUID, lock: bool = False
    ) -> repo.Endpoint:
        endpoint = repo.get_endpoint(
            conn, endpoint_id, tenant_id, for_update=lock and conn.dialect.name == "postgresql"
        )
        if endpoint is None:  # a foreign id answers exactly like a missing one
            raise NotFound(f"webhook endpoint {endpoint_id} not found")
        return endpoint

    # --- fan-out ----------------------------------------------------------------------------------------------

    def fan_out(self, envelope: Envelope) -> int:
        """Consume one `task.status.changed`: a delivery (and its outbox row) per matching live endpoint of the
        task's tenant. Once per event; returns how many deliveries were written (0 for a duplicate)."""
        status = envelope.payload.get("status")
        task_id = uuid.UUID(str(envelope.payload.get("task_id") or envelope.aggregate_id))
        if not status:
            return 0
        # most tenants have no endpoint: one read, and no write transaction or inbox row for their changes
        with read_conn(self._engine) as conn:
            tenant_id = envelope.tenant_id or repo.task_tenant(conn, task_id)
            wanted = tenant_id is not None and any(
                rules.wants(e.event_filter, str(status)) for e in repo.list_endpoints(conn, tenant_id)
            )
        if tenant_id is None or not wanted:
            return 0
        owner: uuid.UUID = tenant_id
        now = self._clock.now()
        written: list[int] = [0]

        def apply(conn: Connection) -> str:
            body = self._message(envelope, task_id, str(status))
            for endpoint in repo.list_endpoints(conn, owner):
                if not rules.wants(endpoint.event_filter, str(status)):
                    continue
                delivery_id = repo.add_delivery(
                    conn,
                    endpoint,
                    event_id=envelope.event_id,
                    event_type=rules.TASK_STATUS_CHANGED,
                    task_id=task_id,
                    payload=body,
                    now=now,
                )
                if delivery_id is not None:
                    schedule(conn, delivery_id, owner, 0, now, trace_id=envelope.trace_id)
                    written[0] += 1
            return f"deliveries: {written[0]}"

        consume_once(self._engine, CONSUMER_GROUP, envelope.event_id, envelope.aggregate_id, apply, now)
        return written[0]

    @staticmethod
    def _message(envelope: Envelope, task_id: uuid.UUID, status: str) -> dict[str, Any]:
        """The Standard Webhooks body: `type`, `timestamp`, and in `data` the event the SSE stream shows."""
        progress = envelope.payload.get("progress")
        at = envelope.occurred_at.isoformat()
        return {
            "type": rules.TASK_STATUS_CHANGED,
            "timestamp": at,
            "data": {
                "id": str(task_id),
                "status": status,
                "version": envelope.aggregate_version,
                "progress": progress if isinstance(progress, int) and not isinstance(progress, bool) else None,
                "at": at,
                "links": {"self": f"/v1/generations/{task_id}"},
            },
        }

    # --- the log and replay -----------------------------------------------------------------------------------

    def deliveries(
        self,
        *,
        tenant_id: uuid.UUID | None = None,
        endpoint_id: uuid.UUID | None = None,
        states: list[str] | None = None,
        task_id: uuid.UUID | None = None,
        limit: int = 100,
    ) -> list[repo.Delivery]:
        chosen = _states(states)
        with read_conn(self._engine) as conn:
            return repo.list_deliveries(
                conn, tenant_id=tenant_id, endpoint_id=endpoint_id, states=chosen, task_id=task_id, limit=limit
            )

    def replay_preview(
        self, *, endpoint_id: uuid.UUID | None = None, states: list[str] | None = None, limit: int = 100
    ) -> tuple[int, list[repo.Delivery]]:
        """(how many match, the oldest `limit` of them): DEAD and FAILED deliveries, or the given subset."""
        chosen = _states(states) or list(repo.REPLAYABLE)
        if set(chosen) - set(repo.REPLAYABLE):
            raise InvalidInput("replay webhooks: only DEAD and FAILED deliveries can be replayed", field="state")
        with read_conn(self._engine) as conn:
            total = repo.count_deliveries(conn, endpoint_id=endpoint_id, states=chosen)
            rows = repo.list_deliveries(conn, endpoint_id=endpoint_id, states=chosen, limit=limit, oldest_first=True)
        return total, rows

    def preview_ids(self, ids: list[str]) -> list[repo.Delivery]:
        with read_conn(self._engine) as conn:
            found = [repo.get_delivery(conn, _uuid(i)) for i in ids]
        return [d for d in found if d is not None]

    def replay(self, ids: list[uuid.UUID], op: Operation) -> dict[str, list[dict[str, str]]]:
        """Put each DEAD/FAILED delivery back in line, due now with a fresh budget, under its original
        webhook-id (receivers dedupe on it). Returns {"done", "skipped"}; audited, dry runs too."""
        op.require_reason()
        now = self._clock.now()
        done: list[dict[str, str]] = []
        skipped: list[dict[str, str]] = []
        with write_tx(self._engine) as conn:
            for delivery_id in ids:
                delivery = repo.get_delivery(conn, delivery_id)
                endpoint = None if delivery is None else repo.get_endpoint(conn, delivery.endpoint_id)
                if delivery is None or delivery.state not in repo.REPLAYABLE:
                    skipped.append({"id": str(delivery_id), "reason": "not DEAD or FAILED (any more)"})
                elif endpoint is None:
                    skipped.append({"id": str(delivery_id), "reason": "its endpoint was removed"})
                elif op.dry_run:
                    done.append({"id": str(delivery_id)})
                elif repo.requeue(conn, delivery_id, now):
                    schedule(conn, delivery_id, delivery.tenant_id, 0, now)
                    done.append({"id": str(delivery_id)})
            outcome = "would_replay" if op.dry_run else "replayed"
            record(conn, op, affected_ids=[d["id"] for d in done], outcome=outcome, now=now)
        return {"done": done, "skipped": skipped}


def schedule(
    conn: Connection,
    delivery_id: uuid.UUID,
    tenant_id: uuid.UUID,
    attempts: int,
    at: datetime,
    *,
    now: datetime | None = None,
    trace_id: str | None = None,
) -> None:
    """The message that makes the next attempt of `delivery_id` at `at` (written with the state that needs it).
    It carries the delivery's attempt count: once an attempt has been recorded since, the message is stale."""
    outbox.add(
        conn,
        EventType.WEBHOOK_DELIVERY_REQUESTED,
        aggregate_type="webhook_delivery",
        aggregate_id=delivery_id,
        aggregate_version=attempts,
        payload={"delivery_id": str(delivery_id), "attempts": attempts},
        now=now or at,
        available_at=at,
        tenant_id=tenant_id,
        trace_id=trace_id,
    )


def _states(states: list[str] | None) -> list[str]:
    chosen: list[str] = []
    for value in states or []:
        for part in value.split(","):
            name = part.strip().upper()
            if not name:
                continue
            if name not in WebhookDeliveryState.__members__:
                known = ", ".join(s.value for s in WebhookDeliveryState)
                raise InvalidInput(f"unknown delivery state {part.strip()!r} (known: {known})", field="state")
            chosen.append(name)
    return chosen


def _uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidInput(f"not a delivery id: {value!r}") from None
