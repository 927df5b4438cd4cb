"""Replaying what the pipeline gave up on (`aivedio replay dlq|orphans|outbox`).

Three piles, one shape: `preview` lists what a filter matches (an exact count and the selected rows, oldest
first), `replay` acts on an explicit id list — the previewed one, or one read back from a plan file — in one
short transaction that re-checks every row and writes the audit row. Every replay is safe to repeat:

- **dlq** — a dead letter is re-published *through the outbox*, never straight to the broker: its outbox row
  (primary key = the envelope's event id) is put back to PENDING, or re-created with that same id if it is gone.
  The relay then publishes it with `message_id = event_id` as always. Keeping the event id is what makes a replay
  harmless: consumers dedupe on `inbox_dedup (consumer_group, event_id)`, so a message that was in fact
  processed before it died (e.g. it failed after its commit) is acknowledged as a duplicate, and one that was not
  is processed once. A fresh event id would defeat exactly that. The submit consumer has no inbox row but is
  guarded the same way by its attempt (only the NEW → SENDING winner calls the provider). The letter gets
  `replayed_at`; if the message dies again, the dead-letter middleware clears it, so it shows up here again.
- **orphans** — a provider event that matched no attempt when it arrived is attached to the attempt that owns
  its job id *now*, through `observations.rematch`, which re-emits it to the reducer (which dedupes by the
  event's source id). Submit and reconciliation already rematch when they learn a job id; what is left here is
  a callback that committed after such a rematch had looked (two concurrent transactions) or a job nobody owns.
- **outbox** — a DEAD row (the relay failed to enqueue it `max_publish_attempts` times) goes back to PENDING
  with its publish attempts reset and `available_at = now`; its id, hence the message id, is unchanged.

A dead letter or DEAD outbox row whose message occurred before the inbox retention (`webhooks.dedup_retention_days`)
is refused with that reason, never re-applied: its inbox row may already be deleted, so a duplicate could not be
told from a first delivery.

A row that no longer qualifies when the replay runs (already replayed, no longer an orphan, no longer DEAD) is
skipped and reported, so applying the same plan twice changes nothing the second time.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.db import attempts, replay_queries, wakeup
from aivedio_engine.db.handles import Connection, Engine
from aivedio_engine.db.outbox import NOTIFY_CHANNEL
from aivedio_engine.db.session import write_tx
from aivedio_engine.domain.durations import parse_seconds
from aivedio_engine.domain.events import BY_ACTOR, REDUCE_BATCH, ROUTES, EventType
from aivedio_engine.domain.status import OutboxStatus
from aivedio_engine.services import observations
from aivedio_engine.services.consume import Envelope, InvalidEnvelope
from aivedio_engine.services.errors import InvalidInput
from aivedio_engine.services.operations import Operation, record
from aivedio_engine.services.retention import replay_refusal

Kind = Literal["dlq", "orphans", "outbox"]
KINDS: tuple[Kind, ...] = ("dlq", "orphans", "outbox")
#: what a successful replay is called in each pile (the JSON key of the acted-on rows)
DONE_KEY: dict[str, str] = {"dlq": "replayed", "orphans": "rematched", "outbox": "republished"}
#: one transaction per replay: bulk commands take a --limit, and a plan cannot exceed what was previewed
MAX_LIMIT = 10_000
#: outbox rows are written with these aggregate types (anything else is a task); used only to re-create a row
_AGGREGATE_TYPES = {
    EventType.PROVIDER_SUBMIT_REQUESTED.value: "attempt",
    EventType.WEBHOOK_DELIVERY_REQUESTED.value: "webhook_delivery",
}


def parse_since(text: str, now: datetime) -> datetime:
    """`30m`, `2h`, `7d` (that long before `now`) or an ISO-8601 time (UTC when it has no offset)."""
    try:
        return now - timedelta(seconds=parse_seconds(text))
    except ValueError:
        pass  # not a duration: an ISO time?
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"--since: {text!r} is neither a duration (30m, 2h, 7d) nor an ISO-8601 time", field="since"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


@dataclass(frozen=True)
class ReplayFilter:
    """`actor` and `error_class` apply to dlq and outbox, `provider` to orphans; `since` to all three (dead
    letters by last_seen_at, orphans by received_at, outbox rows by when they were marked DEAD)."""

    actor: str | None = None
    error_class: str | None = None
    provider: str | None = None
    since: datetime | None = None
    limit: int = 100

    def as_args(self) -> dict[str, Any]:
        return {
            "actor": self.actor,
            "error_class": self.error_class,
            "provider": self.provider,
            "since": self.since.isoformat() if self.since else None,
            "limit": self.limit,
        }


@dataclass(frozen=True)
class Preview:
    kind: str
    #: every row the filter matches, exactly (not capped by --limit)
    total: int
    #: the rows a replay would act on, oldest first
    items: list[dict[str, Any]]

    @property
    def ids(self) -> list[str]:
        return [item["id"] for item in self.items]


@dataclass
class ReplayResult:
    kind: str
    dry_run: bool
    #: acted on (or, in a dry run, would be)
    done: list[dict[str, Any]] = field(default_factory=list)
    #: orphans that still match no attempt
    still_orphan: list[dict[str, Any]] = field(default_factory=list)
    #: no longer qualified (already replayed, gone, no longer DEAD or orphan): harmless
    skipped: list[dict[str, Any]] = field(default_factory=list)
    #: cannot be replayed by this build (not an envelope, unknown actor or event type)
    failed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        if self.dry_run:
            return "dry_run"
        if self.failed:
            return "partial" if self.done else "failed"
        return DONE_KEY[self.kind] if self.done else "nothing"

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "dry_run": self.dry_run,
            "outcome": self.outcome,
            DONE_KEY[self.kind]: self.done,
            "skipped": self.skipped,
            "failed": self.failed,
        }
        if self.kind == "orphans":
            data["still_orphan"] = self.still_orphan
        return data


class ReplayService:
    def __init__(self, engine: Engine, clock: Clock, settings: Settings) -> None:
        self._engine = engine
        self._clock = clock
        self._settings = settings

    # --- what matches --------------------------------------------------------------------------------------

    def preview(self, kind: Kind, flt: ReplayFilter) -> Preview:
        """The exact count of rows matching `flt` and the oldest `flt.limit` of them."""
        _check_kind(kind)
        if not 1 <= flt.limit <= MAX_LIMIT:
            raise InvalidInput(f"--limit must be within 1..{MAX_LIMIT}", field="limit")
        _check_filter(kind, flt)
        total, rows = replay_queries.matching(
            self._engine,
            kind,
            provider=flt.provider,
            actor=flt.actor,
            error_class=flt.error_class,
            since=flt.since,
            limit=flt.limit,
        )
        return Preview(kind, total, [_ITEM[kind](r) for r in rows])

    def preview_ids(self, kind: Kind, ids: Sequence[str]) -> Preview:
        """The rows of a plan, as they are now (a row that no longer qualifies is still listed)."""
        _check_kind(kind)
        keys = _uuids(ids)
        with self._engine.connect() as conn:
            found = {r.id: r for r in replay_queries.by_ids(conn, kind, keys)}
        return Preview(kind, len(found), [_ITEM[kind](found[k]) for k in keys if k in found])

    # --- acting --------------------------------------------------------------------------------------------

    def replay(self, kind: Kind, ids: Sequence[str], op: Operation) -> ReplayResult:
        """Replay exactly `ids` (re-checked under lock), writing one audit row; a dry run changes nothing else."""
        _check_kind(kind)
        op.require_reason()
        keys = _uuids(ids)
        if len(keys) > MAX_LIMIT:
            raise InvalidInput(f"at most {MAX_LIMIT} rows per replay", field="ids")
        result = ReplayResult(kind, op.dry_run)
        now = self._clock.now()
        with write_tx(self._engine) as conn:
            rows = {r.id: r for r in replay_queries.by_ids(conn, kind, keys, lock=True)}
            for key in keys:
                row = rows.get(key)
                if row is None:
                    result.skipped.append({"id": str(key), "reason": "not found"})
                elif (refusal := self._too_old(kind, row, now)) is not None:
                    result.failed.append({"id": str(key), "reason": refusal})
                else:
                    _ACT[kind](conn, row, result, now)
            if result.done and not op.dry_run and kind != "orphans":
                wakeup.notify(conn, NOTIFY_CHANNEL)  # the relays look now rather than at their fallback check
            affected = [d["id"] for d in result.done] + [i for d in result.done for i in d.get("also", [])]
            record(conn, op, affected_ids=affected, outcome=result.outcome, now=now)
        return result

    def _too_old(self, kind: str, row: Any, now: datetime) -> str | None:
        """Why a message is too old to replay (services/retention.py `replay_refusal`), or None. A rematched
        orphan is deduped by the state events' source id, not by the inbox, so it is never too old."""
        if kind == "orphans":
            return None
        if kind == "outbox":
            return replay_refusal(self._settings, [row.created_at], now)
        envelope, _ = _envelope_of(row)
        return replay_refusal(self._settings, [row.first_seen_at, *([envelope.occurred_at] if envelope else [])], now)


# --- filters and rendering of rows -----------------------------------------------------------------------------


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise InvalidInput(f"unknown replay kind {kind!r} (one of: {', '.join(KINDS)})", field="kind")


def _check_filter(kind: str, flt: ReplayFilter) -> None:
    if kind == "orphans":
        if flt.actor or flt.error_class:
            raise InvalidInput("--actor and --error-class do not apply to orphans (use --provider)", field="actor")
    elif flt.provider:
        raise InvalidInput(f"--provider applies to orphans only, not {kind}", field="provider")


def _dlq_item(r: Any) -> dict[str, Any]:
    return {
        "id": str(r.id),
        "task_id": _task_of(r.message),
        "message_id": r.message_id,
        "actor": r.actor,
        "queue": r.queue,
        "error": r.error,
        "seen_count": r.seen_count,
        "first_seen_at": r.first_seen_at.isoformat(),
        "last_seen_at": r.last_seen_at.isoformat(),
        "replayed_at": r.replayed_at.isoformat() if r.replayed_at else None,
    }


def _task_of(message: Any) -> str | None:
    """The task a dead letter was about, so on-call can open it (`tasks show`): named in the payload, or the
    envelope's aggregate when that is a task; None for other aggregates (a webhook delivery) or no envelope."""
    args = (message or {}).get("args") or []
    env: dict[str, Any] = args[0] if len(args) == 1 and isinstance(args[0], dict) else {}
    payload = env.get("payload")
    named = payload.get("task_id") if isinstance(payload, dict) else None
    if named is None and _AGGREGATE_TYPES.get(str(env.get("event_type")), "task") == "task":
        named = env.get("aggregate_id")
    try:
        return str(uuid.UUID(str(named))) if named is not None else None
    except ValueError:
        return None


def _orphan_item(r: Any) -> dict[str, Any]:
    status = (r.observation or {}).get("status")
    return {
        "id": str(r.id),
        "provider": r.provider,
        "job_id": r.provider_job_id,
        "source": r.source,
        "status": status,
        "orphan": r.orphan,
        "received_at": r.received_at.isoformat(),
        "expires_at": r.expires_at.isoformat(),
    }


def _outbox_item(r: Any) -> dict[str, Any]:
    return {
        "id": str(r.id),
        "event_type": r.event_type,
        "target": r.target,
        "aggregate_id": str(r.aggregate_id),
        "status": r.status,
        "publish_attempts": r.publish_attempts,
        "last_error": r.last_error,
        "created_at": r.created_at.isoformat(),
        "available_at": r.available_at.isoformat(),
    }


_ITEM = {"dlq": _dlq_item, "orphans": _orphan_item, "outbox": _outbox_item}


def _uuids(ids: Sequence[str]) -> list[uuid.UUID]:
    seen: dict[uuid.UUID, None] = {}
    for raw in ids:
        try:
            seen[uuid.UUID(str(raw))] = None
        except ValueError:
            raise InvalidInput(f"not a row id: {raw!r}", field="ids") from None
    return list(seen)


# --- the three replays ---------------------------------------------------------------------------------------


def _replay_letter(conn: Connection, row: Any, result: ReplayResult, now: datetime) -> None:
    if row.replayed_at is not None:
        result.skipped.append({"id": str(row.id), "reason": f"already replayed at {row.replayed_at.isoformat()}"})
        return
    if row.actor == REDUCE_BATCH.actor:  # many observations: each goes back to its own outbox row
        envelopes, why = _envelopes_of_batch(row)
        actor = ROUTES[EventType.PROVIDER_STATUS_OBSERVED].actor
    else:
        envelope, why = _envelope_of(row)
        envelopes, actor = ([] if envelope is None else [envelope]), row.actor
    if not envelopes:
        result.failed.append({"id": str(row.id), "reason": why})
        return
    if not result.dry_run:
        for envelope in envelopes:
            _upsert_pending(conn, envelope, actor, now)
        replay_queries.mark_letter_replayed(conn, row.id, now)
    for envelope in envelopes:
        result.done.append({"id": str(row.id), "event_id": str(envelope.event_id), "actor": actor})


def _envelopes_of_batch(row: Any) -> tuple[list[Envelope], str]:
    """The envelopes a dead batched-reducer message carried; none unless every one of them parses."""
    args = (row.message or {}).get("args") or []
    if len(args) != 1 or not isinstance(args[0], list) or not args[0]:
        return [], "the message does not carry a list of envelopes"
    try:
        return [Envelope.parse(body) for body in args[0]], ""
    except (InvalidEnvelope, AttributeError, TypeError) as exc:
        return [], f"invalid envelope: {exc}"


def _envelope_of(row: Any) -> tuple[Envelope | None, str]:
    """The envelope a dead letter carried, if this build can route it again."""
    if row.actor not in BY_ACTOR:
        return None, f"actor {row.actor!r} is not an outbox consumer of this build"
    args = (row.message or {}).get("args") or []
    if len(args) != 1 or not isinstance(args[0], dict):
        return None, "the message does not carry one envelope"
    try:
        envelope = Envelope.parse(args[0])
        EventType(envelope.event_type)
    except (InvalidEnvelope, ValueError) as exc:
        return None, f"invalid envelope: {exc}"
    return envelope, ""


def _upsert_pending(conn: Connection, env: Envelope, actor: str, now: datetime) -> None:
    """Put the event's outbox row back to PENDING, or re-create it under the same id if it is gone."""
    replay_queries.upsert_pending_outbox(
        conn,
        event_id=env.event_id,
        aggregate_type=_AGGREGATE_TYPES.get(env.event_type, "task"),
        aggregate_id=env.aggregate_id,
        aggregate_version=env.aggregate_version,
        event_type=env.event_type,
        schema_version=env.schema_version,
        payload=env.payload,
        target=actor,
        tenant_id=env.tenant_id,
        trace_id=env.trace_id,
        causation_id=env.causation_id,
        occurred_at=env.occurred_at,
        now=now,
    )


def _rematch_orphan(conn: Connection, row: Any, result: ReplayResult, now: datetime) -> None:
    if not row.orphan:
        result.skipped.append(
            {
                "id": str(row.id),
                "reason": "no longer an orphan",
                "attempt_id": str(row.matched_attempt_id) if row.matched_attempt_id else None,
            }
        )
        return
    if any(str(row.id) in d.get("also", []) for d in result.done):
        return  # taken along with an earlier row of the same job
    # only the attempt that owns the job id: the reducer finds its attempt by job id, nothing else
    owner = attempts.by_job(conn, row.provider, row.provider_job_id) if row.provider_job_id else None
    if owner is None:
        result.still_orphan.append({"id": str(row.id), "provider": row.provider, "job_id": row.provider_job_id})
        return
    # rematch takes every orphan event of the job: the others are reported, never left half-matched
    same_job = replay_queries.other_orphans_of_job(conn, row.provider, row.provider_job_id, row.id)
    if not result.dry_run:
        observations.rematch(conn, row.provider, row.provider_job_id, owner.id, now)
    result.done.append(
        {
            "id": str(row.id),
            "provider": row.provider,
            "job_id": row.provider_job_id,
            "attempt_id": str(owner.id),
            "task_id": str(owner.task_id),
            "also": [str(i) for i in same_job],
        }
    )


def _republish(conn: Connection, row: Any, result: ReplayResult, now: datetime) -> None:
    if row.status != OutboxStatus.DEAD.value:
        result.skipped.append({"id": str(row.id), "reason": f"status is {row.status}, not DEAD"})
        return
    try:
        EventType(row.event_type)
    except ValueError:
        result.failed.append(
            {"id": str(row.id), "reason": f"event type {row.event_type!r} is not routed by this build"}
        )
        return
    if row.target not in BY_ACTOR:
        result.failed.append({"id": str(row.id), "reason": f"target {row.target!r} is not an actor of this build"})
        return
    if not result.dry_run:
        replay_queries.republish(conn, row.id, now)
    result.done.append(
        {"id": str(row.id), "event_type": row.event_type, "target": row.target, "last_error": row.last_error}
    )


_ACT = {"dlq": _replay_letter, "orphans": _rematch_orphan, "outbox": _republish}
