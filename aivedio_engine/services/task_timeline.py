"""One task's story as a single timeline (`aivedio tasks show`): state events with their outcome,
attempts, raw provider events, ledger rows, assets, review items, alerts and outbox rows, merged by time.

Each item is a dict with `at`, `kind` and `id` plus the keys of its kind (the `--json` contract). Items that
share a timestamp keep the order they were written in: every id is a UUIDv7 from the writer's clock, so it is
the tie-break. Nothing here prints a signed URL, a request body or a prompt: operators read this in tickets.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from aivedio_engine.db import timeline
from aivedio_engine.db.handles import Connection
from aivedio_engine.db.records import Attempt, Task

KINDS = ("state_event", "attempt", "provider_event", "ledger", "asset", "review", "alert", "outbox")

_TASK_FIELDS = (
    "tenant_id",
    "status",
    "version",
    "progress",
    "requested_model",
    "selected_provider",
    "current_attempt_no",
    "priority",
    "estimated_cost",
    "reserved_amount",
    "actual_cost",
    "cancel_outcome",
    "last_error_class",
    "last_error_code",
    "parked_reason",
    "review_state",
    "next_action_at",
    "next_retry_at",
    "deadline_at",
    "cancel_requested_at",
    "trace_id",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
)


@dataclass(frozen=True, slots=True)
class Timeline:
    task: dict[str, Any]
    items: list[dict[str, Any]]


def build_timeline(conn: Connection, task_id: uuid.UUID) -> Timeline | None:
    task = timeline.task(conn, task_id)
    if task is None:
        return None
    attempt_rows = timeline.attempts(conn, task_id)
    items = [_state_event(r) for r in timeline.state_events(conn, task_id)]
    items += [_attempt(r) for r in attempt_rows]
    items += [_provider_event(r) for r in timeline.attempt_provider_events(conn, attempt_rows)]
    items += [_ledger(r) for r in timeline.ledger_rows(conn, task_id)]
    items += [_asset(r) for r in timeline.task_assets(conn, task.id, _input_assets(task))]
    items += [_review(r) for r in timeline.review_rows(conn, task_id)]
    items += [_alert(r) for r in timeline.subject_alerts(conn, task_id, [a.id for a in attempt_rows])]
    aggregates = [task_id, *(a.id for a in attempt_rows)]
    items += [_outbox(r) for r in timeline.outbox_rows(conn, aggregates)]
    items.sort(key=lambda i: (i["at"], i["id"].int))
    header = {"task_id": task.id, **{f: getattr(task, f) for f in _TASK_FIELDS}}
    return Timeline(task=header, items=items)


def _input_assets(task: Task) -> list[uuid.UUID]:
    """The input assets the task's request named."""
    inputs = []
    for raw in (task.params or {}).get("asset_ids") or []:
        try:
            inputs.append(uuid.UUID(str(raw)))
        except ValueError:
            continue
    return inputs


def _item(kind: str, at: Any, row_id: uuid.UUID, **fields: Any) -> dict[str, Any]:
    return {"at": at, "kind": kind, "id": row_id, **fields}


def _state_event(r: Any) -> dict[str, Any]:
    return _item(
        "state_event",
        r.created_at,
        r.id,
        source=r.source,
        source_event_id=r.source_event_id,
        event_type=r.event_type,
        from_status=r.from_status,
        to_status=r.to_status,
        task_version=int(r.task_version),
        outcome=r.outcome,
        attempt_id=r.attempt_id,
        provider_updated_at=r.provider_updated_at,
        payload=r.payload,
    )


def _attempt(r: Attempt) -> dict[str, Any]:
    return _item(
        "attempt",
        r.created_at,
        r.id,
        attempt_no=int(r.attempt_no),
        provider=r.provider,
        model=r.model,
        submit_state=r.submit_state,
        provider_job_id=r.provider_job_id,
        provider_request_key=r.provider_request_key,
        submitted_at=r.submitted_at,
        completed_at=r.completed_at,
        updated_at=r.updated_at,
        poll_count=int(r.poll_count),
        lookup_count=int(r.lookup_count),
        last_lookup_at=r.last_lookup_at,
        resubmitted_after_unknown=bool(r.resubmitted_after_unknown),
        last_error_class=r.last_error_class,
        provider_error_code=r.provider_error_code,
    )


def _provider_event(r: Any) -> dict[str, Any]:
    # the observation holds output URLs with signatures in them: only its status and progress are shown
    obs = r.observation or {}
    return _item(
        "provider_event",
        r.received_at,
        r.id,
        provider=r.provider,
        source=r.source,
        received_at=r.received_at,
        provider_job_id=r.provider_job_id,
        webhook_id=r.webhook_id,
        verified=bool(r.verified),
        orphan=bool(r.orphan),
        matched=r.matched_attempt_id is not None,
        matched_attempt_id=r.matched_attempt_id,
        status=obs.get("status"),
        progress=obs.get("progress"),
        error_code=obs.get("error_code"),
    )


def _ledger(r: Any) -> dict[str, Any]:
    return _item(
        "ledger",
        r.created_at,
        r.id,
        entry_type=r.entry_type,
        amount=r.amount,
        unit=r.unit,
        business_key=r.business_key,
        reason=r.reason,
        created_by=r.created_by,
        attempt_id=r.attempt_id,
    )


def _asset(r: Any) -> dict[str, Any]:
    return _item(
        "asset",
        r.created_at,
        r.id,
        asset_kind=r.kind,
        profile=r.profile,
        status=r.status,
        size_bytes=r.size_bytes,
        parent_asset_id=r.parent_asset_id,
        attempt_id=r.attempt_id,
        output_index=r.output_index,
        mime=r.mime_detected,
        duration_ms=r.duration_ms,
        width=r.width,
        height=r.height,
        ready_at=r.ready_at,
        error=r.error,
    )


def _review(r: Any) -> dict[str, Any]:
    return _item(
        "review",
        r.created_at,
        r.id,
        state=r.state,
        reason=r.reason,
        asset_id=r.asset_id,
        claimed_by=r.claimed_by,
        claimed_until=r.claimed_until,
        decision=r.decision,
        decided_by=r.decided_by,
        decided_at=r.decided_at,
        note=r.note,
    )


def _alert(r: Any) -> dict[str, Any]:
    return _item(
        "alert",
        r.raised_at,
        r.id,
        rule=r.rule,
        severity=r.severity,
        status=r.status,
        message=r.message,
        subject_type=r.subject_type,
        subject_id=r.subject_id,
        last_seen_at=r.last_seen_at,
        acknowledged_by=r.acknowledged_by,
    )


def _outbox(r: Any) -> dict[str, Any]:
    return _item(
        "outbox",
        r.created_at,
        r.id,
        event_type=r.event_type,
        status=r.status,
        target=r.target,
        aggregate_type=r.aggregate_type,
        available_at=r.available_at,
        published_at=r.published_at,
        publish_attempts=int(r.publish_attempts),
        last_error=r.last_error,
    )
