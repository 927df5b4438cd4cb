"""The task, attempt, outbox and review-item rows as typed, frozen records: what every repository hands to services.

Fields are the tables' columns in their order (`tests/unit/test_records.py` checks it), so a row read with
`select(table)`, a psycopg row of the same column list, or the values a create statement returns become a record
positionally, without a per-column lookup. Services read attributes only; a change of state is written through
the repositories, never on a record.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Self


class _FromRow:
    """`of(row)`: the record of a row of every column in table order (None stays None)."""

    __slots__ = ()

    @classmethod
    def of(cls, row: Iterable[Any] | None) -> Self | None:
        return None if row is None else cls(*row)


@dataclass(frozen=True, slots=True)
class Task(_FromRow):
    """One `generation_tasks` row, every column."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    user_id: uuid.UUID | None
    project_id: uuid.UUID | None
    client_idempotency_key: str
    request_hash: bytes
    status: str
    version: int
    progress: int
    requested_model: str
    selected_provider: str | None
    current_attempt_no: int
    priority: int
    estimated_cost: Decimal
    reserved_amount: Decimal
    actual_cost: Decimal | None
    output_asset_id: uuid.UUID | None
    prompt: str
    params: dict[str, Any]
    next_retry_at: datetime | None
    deadline_at: datetime | None
    cancel_requested_at: datetime | None
    cancel_outcome: str | None
    last_error_class: str | None
    last_error_code: str | None
    parked_reason: str | None
    next_action_at: datetime | None
    review_state: str | None
    trace_id: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    prompt_redacted_at: datetime | None


@dataclass(frozen=True, slots=True)
class Attempt(_FromRow):
    """One `task_attempts` row, every column."""

    id: uuid.UUID
    task_id: uuid.UUID
    attempt_no: int
    provider: str
    model: str
    provider_request_key: str
    provider_job_id: str | None
    submit_state: str
    request_fingerprint: bytes
    provider_error_code: str | None
    provider_updated_at: datetime | None
    submitted_at: datetime | None
    completed_at: datetime | None
    next_poll_at: datetime | None
    poll_count: int
    output_url_expires_at: datetime | None
    resubmitted_after_unknown: bool
    fencing_token: int | None
    last_error_class: str | None
    created_at: datetime
    updated_at: datetime
    lookup_count: int
    last_lookup_at: datetime | None
    last_not_found_at: datetime | None
    vendor_billed: bool | None
    billed_seconds: Decimal | None
    billed_outputs: int | None
    vendor_cost: Decimal | None
    vendor_refunded: bool | None


@dataclass(frozen=True, slots=True)
class ReviewItem(_FromRow):
    """One `review_items` row, every column."""

    id: uuid.UUID
    task_id: uuid.UUID | None
    asset_id: uuid.UUID | None
    reason: str
    state: str
    claimed_by: str | None
    claimed_until: datetime | None
    decision: str | None
    decided_by: str | None
    decided_at: datetime | None
    note: str | None
    created_at: datetime
    workflow_task_id: uuid.UUID | None


@dataclass(frozen=True, slots=True)
class ReviewRow(ReviewItem):
    """A review item with what the queue shows of its subject: the task's (or step's) status, project and step."""

    #: never None: an item names exactly one subject (`one_subject`), which its foreign key keeps
    task_status: str
    project_id: uuid.UUID | None
    step_key: str | None


@dataclass(frozen=True, slots=True)
class OutboxRow(_FromRow):
    """One `outbox_events` row, every column: what the relay builds a broker message from."""

    id: uuid.UUID
    aggregate_type: str
    aggregate_id: uuid.UUID
    aggregate_version: int
    event_type: str
    schema_version: int
    payload: dict[str, Any]
    status: str
    target: str
    available_at: datetime
    publish_attempts: int
    last_error: str | None
    tenant_id: uuid.UUID | None
    trace_id: str | None
    causation_id: uuid.UUID | None
    created_at: datetime
    published_at: datetime | None
