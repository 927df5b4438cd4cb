"""One attempt of one client webhook delivery: claim → sign → POST (no transaction open) → record.

Isolation: one slow endpoint must not delay other tenants' deliveries. Three things bound what it can take:
- one message is one delivery, so nothing queues *behind* a hanging request inside a worker thread;
- an attempt has one wall-clock budget (`client_webhooks.timeout_s`), connect and answer included;
- at most `max_in_flight_per_endpoint` attempts to the same endpoint run at once in this process: another one
  is handed back without counting an attempt, due again after 1 s or after as long as the oldest attempt in
  flight has been running (at most `timeout_s`). So a hanging endpoint holds that many worker threads at most,
  the rest keep serving everyone else, and its backlog is offered again about once per `timeout_s`.

Crash safety: the claim moves `next_attempt_at` to the end of the attempt's budget and writes a watchdog message
for that moment. If the process dies mid-attempt, the watchdog finds the delivery due again and retries it; if
the attempt finished, it finds nothing due and does nothing.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from enum import StrEnum

import structlog
from standardwebhooks.webhooks import Webhook

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.db import webhooks as repo
from aivedio_engine.db.handles import Engine
from aivedio_engine.db.session import read_conn, write_tx
from aivedio_engine.domain import webhooks as rules
from aivedio_engine.domain.retry import Step
from aivedio_engine.domain.status import WebhookDeliveryState
from aivedio_engine.fetch import egress
from aivedio_engine.fetch.resolver import Resolver, SystemResolver
from aivedio_engine.services.webhooks import schedule
from aivedio_engine.testing.failpoints import failpoint

log = structlog.get_logger("aivedio.webhooks")
#: a busy endpoint's delivery is offered again at least this much later (at most `timeout_s`)
BUSY_RETRY_S = 1.0
#: slack on top of the attempt's budget before a claim counts as abandoned
CLAIM_SLACK_S = 5.0
_ERROR_CHARS = 500


class Outcome(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    DEAD = "dead"
    BUSY = "busy"  # handed back: the endpoint already has its share of attempts in flight here
    SKIPPED = "skipped"  # not due (a duplicate or stale message), already delivered, or replayed meanwhile


class _Gate:
    """Attempts in flight per endpoint in this process, with when each started."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._started: dict[uuid.UUID, list[float]] = {}

    @contextmanager
    def enter(self, endpoint_id: uuid.UUID) -> Iterator[float | None]:
        """Yields None when admitted, else how long the oldest attempt in flight to the endpoint has been
        running (s): a hanging endpoint's backlog is then offered again less and less often."""
        now = time.monotonic()
        with self._lock:
            started = self._started.setdefault(endpoint_id, [])
            busy_for = None if len(started) < self._limit else now - min(started)
            if busy_for is None:
                started.append(now)
        try:
            yield busy_for
        finally:
            if busy_for is None:
                with self._lock:
                    started.remove(now)
                    if not started:
                        del self._started[endpoint_id]


class WebhookDeliverer:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        settings: Settings,
        *,
        resolver: Resolver | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._settings = settings.client_webhooks
        self._budget = settings.retry.budget(Step.NOTIFICATION)
        self._resolver = resolver or SystemResolver()
        self._rng = rng or random.Random()
        self._gate = _Gate(self._settings.max_in_flight_per_endpoint)

    def deliver(self, delivery_id: uuid.UUID, attempts: int | None = None) -> Outcome:
        """Make the attempt a `webhook.delivery.requested` message asks for; `attempts` is the count the message
        was written for (a message written before a later attempt was recorded is stale)."""
        with read_conn(self._engine) as conn:
            found = repo.get_delivery(conn, delivery_id)
        if found is None or found.state not in repo.RETRYABLE:
            return Outcome.SKIPPED
        if attempts is not None and found.attempts != attempts:
            return Outcome.SKIPPED
        with self._gate.enter(found.endpoint_id) as busy_for:
            if busy_for is not None:
                return self._hand_back(found, busy_for)
            return self._attempt(delivery_id)

    def _hand_back(self, delivery: repo.Delivery, busy_for: float) -> Outcome:
        now = self._clock.now()
        if delivery.next_attempt_at is not None and delivery.next_attempt_at > now:
            return Outcome.SKIPPED  # not due: the message that makes it due is already written
        # a slot of a quick endpoint frees within a second; one stuck for 8 s will not free in the next one
        wait_s = min(max(BUSY_RETRY_S, busy_for), self._settings.timeout_s)
        due = now + timedelta(seconds=wait_s)
        with write_tx(self._engine) as conn:
            repo.release(conn, delivery.id, due, now)
            schedule(conn, delivery.id, delivery.tenant_id, delivery.attempts, due, now=now)
        return Outcome.BUSY

    def _attempt(self, delivery_id: uuid.UUID) -> Outcome:
        now = self._clock.now()
        hold = now + timedelta(seconds=self._settings.timeout_s + CLAIM_SLACK_S)
        with write_tx(self._engine) as conn:
            delivery = repo.claim(conn, delivery_id, now, hold)
            if delivery is None:
                return Outcome.SKIPPED
            endpoint = repo.read_endpoint(conn, delivery.endpoint_id)
            if endpoint is None or endpoint.removed_at is not None:
                repo.kill(conn, delivery.id, "endpoint removed", now)
                return Outcome.DEAD
            schedule(conn, delivery.id, delivery.tenant_id, delivery.attempts, hold, now=now)  # the watchdog
        failpoint("webhooks.after_claim")

        status_code: int | None = None
        error: str | None = None
        permanent = False
        try:
            body, headers = _signed(delivery, endpoint, now)
            response = egress.post(
                endpoint.url,
                body,
                headers,
                resolver=self._resolver,
                allow_private=self._settings.allow_private_networks,
                connect_timeout_s=self._settings.connect_timeout_s,
                timeout_s=self._settings.timeout_s,
                max_response_bytes=self._settings.max_response_bytes,
            )
            status_code = response.status
            if not rules.is_success(status_code):
                error = f"HTTP {status_code}: {response.body[:200].decode('utf-8', 'replace')}".strip()
        except egress.EgressError as exc:
            error, permanent = str(exc), exc.permanent
        return self._record(delivery, now, status_code, error, permanent)

    def _record(
        self,
        delivery: repo.Delivery,
        attempted_at: datetime,
        status_code: int | None,
        error: str | None,
        permanent: bool,
    ) -> Outcome:
        now = self._clock.now()
        attempts = delivery.attempts + 1
        if error is None:
            state, outcome, retry_at = WebhookDeliveryState.DELIVERED, Outcome.DELIVERED, None
        else:
            first = delivery.first_attempt_at or attempted_at
            retry_at = None if permanent else rules.next_attempt_at(self._budget, attempts, first, now, self._rng)
            if retry_at is None:
                state, outcome = WebhookDeliveryState.DEAD, Outcome.DEAD
            else:
                state, outcome = WebhookDeliveryState.FAILED, Outcome.RETRY
        with write_tx(self._engine) as conn:
            repo.record_attempt(
                conn,
                delivery,
                state=state,
                attempted_at=attempted_at,
                status_code=status_code,
                error=None if error is None else error[:_ERROR_CHARS],
                next_attempt_at=retry_at,
                now=now,
            )
            if retry_at is not None:
                schedule(conn, delivery.id, delivery.tenant_id, attempts, retry_at, now=now)
            failpoint("webhook.before_commit")
        failpoint("webhook.after_commit")
        log.info(
            "webhook.attempt",
            delivery_id=str(delivery.id),
            endpoint_id=str(delivery.endpoint_id),
            task_id=str(delivery.task_id),
            attempt=attempts,
            outcome=outcome.value,
            status_code=status_code,
            error=error,
            retry_at=retry_at and retry_at.isoformat(),
        )
        return outcome


def _signed(delivery: repo.Delivery, endpoint: repo.Endpoint, now: datetime) -> tuple[bytes, dict[str, str]]:
    """The exact bytes sent and the Standard Webhooks headers: one `v1,` signature per live secret."""
    body = json.dumps(delivery.payload, separators=(",", ":"), sort_keys=True)
    msg_id = f"msg_{delivery.id.hex}"
    secrets = rules.signing_secrets(endpoint.secret, endpoint.previous_secret, endpoint.previous_secret_until, now)
    signatures = " ".join(Webhook(s).sign(msg_id, now, body) for s in secrets)
    return body.encode("utf-8"), {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signatures,
    }
