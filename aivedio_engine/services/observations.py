"""Provider observations (callbacks and polls) become raw `provider_events` rows and one event for the reducer.

Both sources converge here: the raw event and its `provider.status.observed` outbox row commit together, so a
callback answered 2xx is never lost, and a repeated one (same webhook id, or the same fingerprint for polls)
is stored once. An event whose job id matches no attempt yet is kept as an orphan; `rematch` re-emits it when
the submit response that carries the job id is finally recorded (a callback can beat the submit response). Its
request key alone binds it only to an ambiguous submit (the reducer does that): an early callback for an attempt
still being sent is an orphan too, and so is one the reducer found no attempt for (`keep_as_orphan`).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import structlog

from aivedio_engine.clock import new_id
from aivedio_engine.db import attempts, outbox, tasks
from aivedio_engine.db import observations as raw_events
from aivedio_engine.db.handles import Connection
from aivedio_engine.db.records import Attempt
from aivedio_engine.domain.events import EventType
from aivedio_engine.domain.status import AttemptStatus, EventSource
from aivedio_engine.domain.text import is_storable
from aivedio_engine.providers.base import Observation

ORPHAN_TTL = timedelta(days=7)
log = structlog.get_logger("aivedio.callbacks")


def fingerprint(provider: str, obs: Observation) -> str:
    """Stable identity of an observation without an event id: never just job + status, since a
    vendor may repeat a status with different outputs or errors."""
    canonical = json.dumps(
        {
            "p": provider,
            "j": obs.job_id,
            "s": obs.status.value,
            "u": obs.provider_updated_at.isoformat() if obs.provider_updated_at else None,
            "o": [o.url.split("?")[0] for o in obs.outputs],
            "e": obs.error_code,
            "g": obs.progress,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return "fp:" + hashlib.sha256(canonical.encode()).hexdigest()


def to_payload(
    provider: str, obs: Observation, source: EventSource, dedup_key: str, provider_event_id: uuid.UUID
) -> dict[str, Any]:
    return {
        "provider": provider,
        "source": source.value,
        "dedup_key": dedup_key,
        "provider_event_id": str(provider_event_id),
        "job_id": obs.job_id,
        "status": obs.status.value,
        "provider_updated_at": obs.provider_updated_at.isoformat() if obs.provider_updated_at else None,
        "progress": obs.progress,
        "error_code": obs.error_code,
        "error_message": (obs.error_message or "")[:500],
        "billed": obs.billed,
        **obs.billed_units(),
        "request_key": obs.request_key,
        "outputs": [
            {
                "url": o.url,
                "index": o.index,
                "content_type": o.content_type,
                "size_bytes": o.size_bytes,
                "expires_at": o.expires_at.isoformat() if o.expires_at else None,
            }
            for o in obs.outputs
        ],
    }


def record(
    conn: Connection,
    provider: str,
    obs: Observation,
    source: EventSource,
    now: datetime,
    *,
    raw_body: bytes | None = None,
    headers_digest: str | None = None,
    verified: bool = True,
) -> bool:
    """Store one observation and queue it for the reducer. Returns False for a repeat (nothing stored), and for
    an observation that cannot be used (see `unusable`), which is kept as a rejected raw event instead."""
    reason = unusable(obs)
    if reason is not None:
        _store_rejected(conn, provider, obs, source, now, reason, raw_body, headers_digest, verified)
        return False
    dedup_key = f"wh:{obs.event_id}" if obs.event_id else fingerprint(provider, obs)
    attempt: attempts.AttemptRef | Attempt | None = attempts.by_job(conn, provider, obs.job_id)
    if attempt is None and obs.request_key:
        by_key = attempts.by_request_key(conn, provider, obs.request_key)
        # only an ambiguous submit is bound by its request key, and a closed one's job recorded as a duplicate
        # (the reducer does both); an attempt whose job id is simply not recorded yet gets this event when it is
        # (`rematch`), so it waits as an orphan
        if by_key is not None and by_key.submit_state in _BOUND_BY_KEY:
            attempt = by_key
    event_id = new_id()
    payload = to_payload(provider, obs, source, dedup_key, event_id)
    stored = raw_events.store(
        conn,
        event_id=event_id,
        provider=provider,
        source=source.value,
        webhook_id=obs.event_id,
        dedup_key=dedup_key,
        verified=verified,
        headers_digest=headers_digest,
        body=raw_body,
        job_id=obs.job_id,
        request_key=obs.request_key,
        matched_attempt_id=attempt.id if attempt else None,
        now=now,
        expires_at=now + ORPHAN_TTL,
        observation=payload,
    )
    if not stored:
        return False
    if attempt is not None:
        _emit(conn, provider, obs_payload=payload, task_id=attempt.task_id, now=now)
    return True


#: attempts a status naming their request key goes to: an ambiguous submit (its job found), one closed as never
#: created (a late job: `late_jobs`)
_BOUND_BY_KEY = frozenset({AttemptStatus.UNKNOWN.value, AttemptStatus.FAILED_BEFORE_ACCEPT.value})

#: the provider_events columns an observation's identifiers go into (tables.py); `wh:` prefixes the event id
_ID_LIMITS = {"job_id": 256, "request_key": 128, "event_id": 250}


def unusable(obs: Observation) -> str | None:
    """Why a (validly signed) observation cannot be stored as such, or None. A vendor's oversized id or a NUL in
    its text must not fail the transaction — a 500 makes the vendor retry it forever — so the event is kept
    raw, for an engineer, and never reaches the reducer."""
    for name, limit in _ID_LIMITS.items():
        value = getattr(obs, name)
        if value is not None and (not isinstance(value, str) or not value or len(value) > limit):
            return f"{name} is not a string of 1-{limit} characters"
    if not all(map(is_storable, _strings(to_payload("", obs, EventSource.CALLBACK, "", uuid.UUID(int=0))))):
        return "a text field holds NUL or an unpaired surrogate"
    return None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def _store_rejected(
    conn: Connection,
    provider: str,
    obs: Observation,
    source: EventSource,
    now: datetime,
    reason: str,
    raw_body: bytes | None,
    headers_digest: str | None,
    verified: bool,
) -> None:
    event_id = obs.event_id if isinstance(obs.event_id, str) and _usable_id(obs.event_id, 250) else None
    # a repeat delivery of the same rejected event is the same row: by webhook id, else by what it said
    dedup_key = f"wh:{event_id}" if event_id else fingerprint(provider, obs)
    raw_events.store(
        conn,
        event_id=new_id(),
        provider=provider,
        source=source.value,
        webhook_id=event_id,
        dedup_key=dedup_key,
        verified=verified,
        headers_digest=headers_digest,
        body=raw_body,
        now=now,
        expires_at=now + ORPHAN_TTL,
        rejected=reason,
    )
    log.warning("provider event rejected", provider=provider, source=source.value, reason=reason)


def _usable_id(value: str, limit: int) -> bool:
    return 0 < len(value) <= limit and is_storable(value)


def rematch(conn: Connection, provider: str, job_id: str, attempt_id: uuid.UUID, now: datetime) -> int:
    """Attach orphan events of `job_id` to the attempt that now owns it, and queue them for the reducer."""
    rows = raw_events.orphans_of(conn, provider, job_id)
    if not rows:
        return 0
    attempt = attempts.get(conn, attempt_id)
    for row in rows:
        raw_events.match(conn, row.id, attempt_id)
        if row.observation:
            _emit(conn, provider, obs_payload=dict(row.observation), task_id=attempt.task_id, now=now)
    return len(rows)


def keep_as_orphan(conn: Connection, obs_payload: dict[str, Any]) -> None:
    """The reducer found no attempt for this observation (its job id is not bound yet): it becomes an orphan
    again, so that binding the job id replays it instead of it being consumed as unmatched and lost."""
    event_id = obs_payload.get("provider_event_id")
    if event_id:
        raw_events.unmatch(conn, uuid.UUID(str(event_id)))


def _emit(conn: Connection, provider: str, *, obs_payload: dict[str, Any], task_id: uuid.UUID, now: datetime) -> None:
    # the task's trace follows the provider's answer, so one trace_id finds the request and its outcome in logs
    task = tasks.tenant_and_trace(conn, task_id)
    outbox.add(
        conn,
        EventType.PROVIDER_STATUS_OBSERVED,
        aggregate_type="task",
        aggregate_id=task_id,
        aggregate_version=0,
        payload=obs_payload,
        now=now,
        tenant_id=task.tenant_id if task else None,
        trace_id=task.trace_id if task else None,
    )
