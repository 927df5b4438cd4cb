"""Operator actions on System B steps (the TUI projects screen): the retry entry and a reviewer's approval, each
one transaction with its audit row — the step moved by WorkflowService (which closes the step's review item),
then the stream signalled once the commit returned."""

from __future__ import annotations

import uuid
from typing import Any

from aivedio_engine.clock import Clock
from aivedio_engine.db.handles import Engine
from aivedio_engine.db.session import write_tx
from aivedio_engine.domain.workflow import StepEvent
from aivedio_engine.services import operations
from aivedio_engine.services.operations import Operation
from aivedio_engine.services.workflows import Step, WorkflowService


class ProjectOps:
    def __init__(self, engine: Engine, clock: Clock, workflows: WorkflowService) -> None:
        self._engine = engine
        self._clock = clock
        self._workflows = workflows

    def retry_step(self, project_id: uuid.UUID, step_key: str, op: Operation) -> Step:
        """A failed or manual_required step back to pending with a fresh retry budget (same row)."""
        return self._decide(project_id, step_key, StepEvent.RETRY_REQUESTED, op, "retried", {"retry_count": 0})

    def approve_step(self, project_id: uuid.UUID, step_key: str, op: Operation) -> Step:
        """A manual_required step accepted as it is: success, and the project goes on."""
        return self._decide(project_id, step_key, StepEvent.APPROVED, op, "approved", {})

    def _decide(
        self,
        project_id: uuid.UUID,
        step_key: str,
        event: StepEvent,
        op: Operation,
        outcome: str,
        values: dict[str, Any],
    ) -> Step:
        reason = op.require_reason()
        with write_tx(self._engine) as conn:
            moved = self._workflows.decide_in(conn, project_id, step_key, event, by=op.actor, note=reason, **values)
            operations.record(conn, op, affected_ids=[project_id, moved.id], outcome=outcome, now=self._clock.now())
        self._workflows.signal(project_id)
        return moved
