"""Provider callbacks: verify over the raw body, persist the raw event + its outbox row, answer fast.

Nothing slow happens here (no download, no transcode, no provider call): the reducer does the work from the
outbox, so a provider's retry timer never races our processing.

A callback that fails verification is answered 401 and counted: `aivedio_callback_verify_failures_total{provider,
reason}` in this process and a `callback_rejections` row per provider, reason and window, which the alert rule
`callback_verify_failures` reads. Nothing else of the request is kept: it proved nothing about who sent it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aivedio_engine.clock import Clock
from aivedio_engine.config import AlertSettings
from aivedio_engine.db import callback_rejections
from aivedio_engine.db.handles import Engine, SQLAlchemyError
from aivedio_engine.db.session import write_tx
from aivedio_engine.domain.status import EventSource
from aivedio_engine.observability.metrics import CALLBACK_VERIFY_FAILURES
from aivedio_engine.providers.base import CallbackRejected, Observation
from aivedio_engine.services import observations
from aivedio_engine.services.errors import NotFound, Unauthorized
from aivedio_engine.testing.failpoints import failpoint

log = logging.getLogger(__name__)


class CallbackUnauthorized(Unauthorized):
    code = "callback-rejected"


@dataclass(frozen=True, slots=True)
class CallbackResult:
    received: int
    stored: int


class CallbackService:
    def __init__(self, engine: Engine, clock: Clock, providers: Any, alerts: AlertSettings) -> None:
        self._engine = engine
        self._clock = clock
        self._providers = providers
        self._window_s = alerts.callback_verify_window_s

    def receive(self, provider_name: str, headers: Mapping[str, str], raw_body: bytes) -> CallbackResult:
        try:
            provider = self._providers[provider_name]
        except KeyError:
            raise NotFound(f"no provider named {provider_name!r}") from None
        now = self._clock.now()
        try:
            found = provider.parse_callback(headers, raw_body, now)
        except CallbackRejected as exc:
            self._count_rejection(provider_name, exc, now)
            raise CallbackUnauthorized(f"callback rejected: {exc}") from None
        digest = hashlib.sha256(
            "\n".join(f"{k.lower()}:{v}" for k, v in sorted(headers.items())).encode("utf-8", "replace")
        ).hexdigest()
        stored = 0
        with write_tx(self._engine) as conn:
            for obs in found:
                stored += observations.record(
                    conn, provider_name, obs, EventSource.CALLBACK, now, raw_body=raw_body, headers_digest=digest
                )
            failpoint("callback.before_commit")
        failpoint("callback.after_commit")
        return CallbackResult(received=len(found), stored=stored)

    def _count_rejection(self, provider_name: str, exc: CallbackRejected, now: datetime) -> None:
        CALLBACK_VERIFY_FAILURES.labels(provider_name, exc.reason.value).inc()
        try:
            with write_tx(self._engine) as conn:
                callback_rejections.record(conn, provider_name, exc.reason.value, str(exc), now, self._window_s)
        except SQLAlchemyError as db_exc:
            # the sender still gets its 401: the counter above has the failure, the alert misses it
            log.warning("callback rejection of %s not recorded: %s", provider_name, db_exc)

    def report(self, provider_name: str, observation: Observation) -> bool:
        """A provider running in this process (`local`) reports a job's change itself: stored as its callback
        would be (nothing to verify: it never crossed a network), deduplicated by its event id; False for a repeat."""
        failpoint("callback.report")  # chaos tests lose the report here: the poll must still complete the task
        now = self._clock.now()
        with write_tx(self._engine) as conn:
            return observations.record(conn, provider_name, observation, EventSource.CALLBACK, now)
