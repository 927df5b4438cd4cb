"""WorkflowService: the only code that moves a System B project or step.

Workers report what happened to a step (success with its output, or failure with an error code); this service
applies the report through the step machine, lets `decide_failure` choose between retrying (30 s, 2 min, 5 min),
failed and manual_required, creates the steps that became ready, and derives the project's status from its
steps. Every method is one short transaction; nothing here calls a provider or runs ffmpeg.

The project lock `lock:project:{id}:workflow` is a lease kept in the project row: a step whose type needs it
is claimed only together with the lock (lock_holder = the step, lock_until = now + the step's timeout), under
the project's version CAS, so two compositions of one project never run at once and a holder that died loses
the lock at its deadline. The database stays the truth; no Redis key can disagree with it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from aivedio_engine.clock import Clock
from aivedio_engine.db import assets as asset_rows
from aivedio_engine.db import workflows as repo
from aivedio_engine.db.handles import Connection, Engine, IntegrityError
from aivedio_engine.db.session import read_conn, write_tx
from aivedio_engine.domain.project import (
    ProjectEvent,
    ProjectStatus,
    base_key,
    derive_status,
    project_event,
    ready_steps,
)
from aivedio_engine.domain.project_cost import CostEstimate, estimate_project, local_cost
from aivedio_engine.domain.requests import Catalog
from aivedio_engine.domain.status import AssetKind, AssetStatus, ReviewState
from aivedio_engine.domain.step_limits import StepLimits
from aivedio_engine.domain.workflow import (
    STEP_MACHINE,
    STEP_SPECS,
    ErrorCode,
    Priority,
    StepEvent,
    StepStatus,
    StepType,
    decide_failure,
    timed_out,
)
from aivedio_engine.services.errors import Conflict, IdempotencyKeyReused, IllegalState, NotFound
from aivedio_engine.services.idempotency import checked_key
from aivedio_engine.services.step_claims import Admission, redrive, wake_after
from aivedio_engine.workflows import catalog

if TYPE_CHECKING:
    from aivedio_engine.notify import Notifier
    from aivedio_engine.ratelimit import BucketStore

log = logging.getLogger(__name__)
#: due steps a claim looks past the ones it starts: those held back by a limit or the project lock
_CLAIM_LOOKAHEAD = 16
#: how a step's open review item closes when the step leaves manual_required by this event
_REVIEW_CLOSED_BY = {
    StepEvent.APPROVED: ReviewState.APPROVED,
    StepEvent.REJECTED: ReviewState.REJECTED,
    StepEvent.RETRY_REQUESTED: ReviewState.EXPIRED,
    StepEvent.CANCEL_REQUESTED: ReviewState.EXPIRED,
}

Project = repo.Project
Step = repo.Step


class UserBusy(Conflict):
    """: one formal project per user at a time."""

    code = "user-project-open"


def input_hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ProjectView:
    project: Project
    steps: list[Step]


class WorkflowService:
    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        notifier: Notifier | None = None,
        limits: StepLimits | None = None,
        redrive_after_s: float = 60,
        buckets: BucketStore | None = None,
        *,
        catalog: Catalog | None = None,
        local_step_credits: Mapping[str, Decimal] | None = None,
    ) -> None:
        self._engine = engine
        #: prices a project's vendor steps up front (no catalog: they are estimated at 0)
        self._catalog = catalog or Catalog((), "", 0, 0)
        #: `[workflows] local_step_credits`: what a local step costs, by step type
        self._local_credits = dict(local_step_credits or {})
        self._clock = clock
        self._notifier = notifier
        self._limits = limits or StepLimits()
        self._redrive_after = timedelta(seconds=redrive_after_s)
        self._buckets = buckets

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        """`write_tx`, then a "project changed" signal for each project it moved, once the commit returned (the
        way task streams are woken): a stream woken before the commit could read the old rows and sleep again."""
        changed: set[uuid.UUID] = set()
        with write_tx(self._engine) as conn:
            try:
                yield conn
            finally:
                changed = conn.info.pop(repo.CHANGED, set())
        self.signal(*changed)

    def signal(self, *project_ids: uuid.UUID) -> None:
        """Wake the event streams of these projects. A lost signal costs a heartbeat of latency, never an event
        (streams re-read the history on every heartbeat), so a notifier error is logged and swallowed."""
        if self._notifier is None:
            return
        for project_id in project_ids:
            try:
                self._notifier.publish(project_id, 0)
            except Exception as exc:  # noqa: BLE001 - the commit stands; only the wake-up was lost
                log.warning("project %s: change signal lost (%r)", project_id, exc)

    # --- projects ---------------------------------------------------------------------------------------------

    def create(
        self,
        tenant_id: uuid.UUID,
        workflow: str,
        *,
        user_ref: str,
        input: dict[str, Any],
        idempotency_key: str | None = None,
        formal: bool = False,
        priority: int = Priority.PREVIEW,
        cost_estimate: Decimal | None = None,
    ) -> tuple[Project, bool]:
        """Create a project and its first ready steps; returns (project, created). The same key with the same
        input returns the original; with another input it is refused (a duplicate click never makes two).
        `cost_estimate`: by default what its steps will cost (`estimate`); given, it is stored as is."""
        if idempotency_key is not None:
            idempotency_key = checked_key(idempotency_key)
        wf = catalog.get(workflow)
        if cost_estimate is None:
            cost_estimate = self.estimate(workflow, input).total
        # the whole request is the idempotency fingerprint: the same key for another user or tier is another request
        request = {"user_ref": user_ref, "formal": formal, "priority": int(priority)}
        digest = input_hash({"workflow": workflow, "input": input, **request})
        now = self._clock.now()
        try:
            with self._tx() as conn:
                if idempotency_key is not None:
                    existing = repo.project_by_key(conn, tenant_id, idempotency_key)
                    if existing is not None:
                        return self._replay(existing, digest), False
                if formal and (busy := repo.open_formal_project_of(conn, tenant_id, user_ref)) is not None:
                    if idempotency_key is not None and busy.idempotency_key == idempotency_key:
                        # a twin committed between our key lookup and this one: it is our own project
                        return self._replay(busy, digest), False
                    raise UserBusy(f"user {user_ref} already has an open formal project {busy.id} ({busy.status})")
                project = repo.insert_project(
                    conn,
                    tenant_id=tenant_id,
                    workflow=wf.name,
                    user_ref=user_ref,
                    priority=int(priority),
                    formal=formal,
                    idempotency_key=idempotency_key,
                    input=input,
                    input_hash=digest,
                    cost_estimate=cost_estimate,
                    now=now,
                )
                self._spawn_ready(conn, project, now)
                return project, True
        except IntegrityError:
            # a concurrent twin won the key (or the user's formal slot): answer as if we had come second
            with read_conn(self._engine) as conn:
                existing = repo.project_by_key(conn, tenant_id, idempotency_key) if idempotency_key else None
            if existing is None:
                raise UserBusy(f"user {user_ref} already has an open formal project") from None
            return self._replay(existing, digest), False

    def estimate(self, workflow: str, input: dict[str, Any]) -> CostEstimate:
        """What a project of this workflow and input will cost, step by step, before it runs."""
        return estimate_project(catalog.get(workflow), input, self._catalog, self._local_credits)

    def local_price(self, step_type: StepType) -> Decimal:
        """The configured price of a local step type (0 for vendor steps: their generation task prices them)."""
        return Decimal(0) if STEP_SPECS[step_type].vendor else local_cost(step_type, self._local_credits)

    @staticmethod
    def _replay(existing: Project, digest: str) -> Project:
        if existing.input_hash != digest:
            raise IdempotencyKeyReused(f"idempotency key {existing.idempotency_key!r} was used for another input")
        return existing

    def get(self, project_id: uuid.UUID, tenant_id: uuid.UUID | None = None) -> ProjectView:
        with read_conn(self._engine) as conn:
            project = repo.project(conn, project_id, tenant_id)
            if project is None:
                raise NotFound(f"project {project_id} not found")
            return ProjectView(project, repo.steps_of(conn, project_id))

    def find(self, tenant_id: uuid.UUID, idempotency_key: str) -> Project | None:
        """The tenant's project made under this idempotency key, if any (a re-run of the same command resumes it)."""
        with read_conn(self._engine) as conn:
            return repo.project_by_key(conn, tenant_id, checked_key(idempotency_key))

    def list_projects(
        self, tenant_id: uuid.UUID | None = None, limit: int = 50, cursor: uuid.UUID | None = None
    ) -> list[Project]:
        with read_conn(self._engine) as conn:
            return repo.list_projects(conn, tenant_id, limit, cursor)

    def cancel(self, project_id: uuid.UUID, tenant_id: uuid.UUID | None = None) -> Project:
        now = self._clock.now()
        with self._tx() as conn:
            project = self._project(conn, project_id, tenant_id)
            if project.status is ProjectStatus.CANCELLED:
                return project
            if project_event(project.status, ProjectStatus.CANCELLED) is None:
                raise IllegalState(f"project {project_id} is {project.status}: nothing to cancel")
            for s in repo.steps_of(conn, project_id):
                if STEP_MACHINE.edge(s.status, StepEvent.CANCEL_REQUESTED) is not None:
                    repo.move_step(conn, s, event=StepEvent.CANCEL_REQUESTED, to_status=StepStatus.CANCELLED, now=now)
                    if s.status is StepStatus.RUNNING:  # a capped queue's slot is free again
                        wake_after(conn, s, self._limits, now)
                    if s.status is StepStatus.MANUAL_REQUIRED:
                        repo.close_review(conn, s.id, ReviewState.EXPIRED, now, None, "project cancelled")
            return repo.update_project(
                conn,
                project,
                now,
                status=ProjectStatus.CANCELLED.value,
                finished_at=now,
                lock_holder=None,
                lock_until=None,
            )

    # --- steps: claim and report ------------------------------------------------------------------------------

    def claim(self, queues: list[str], limit: int = 1) -> list[Step]:
        """Start up to `limit` due steps of these queues (pending, or retrying past its delay), best priority first.
        A step over a limit (`step_claims`) or needing the project lock held by another stays due: it is woken
        again when the step holding it back stops running."""
        now = self._clock.now()
        started: list[Step] = []
        with self._tx() as conn:
            admission = Admission(conn, self._limits, queues, now, self._buckets)
            skip = admission.at_limit(queues)
            for s in repo.due_steps(conn, queues, now, limit + _CLAIM_LOOKAHEAD, skip):
                if len(started) >= limit:
                    break
                spec = STEP_SPECS[s.task_type]
                if not admission.admit(s):
                    continue
                if spec.needs_lock and not self._take_lock(conn, s, now):
                    continue
                # a new try of a vendor step makes its own generation task: the last one stays in the history
                previous = {"previous_generation_task_id": str(s.generation_task_id)} if s.generation_task_id else None
                started.append(
                    repo.move_step(
                        conn,
                        s,
                        event=StepEvent.STARTED,
                        to_status=StepStatus.RUNNING,
                        now=now,
                        payload=previous,
                        started_at=now,
                        generation_task_id=None,
                    )
                )
                self._advance_project(conn, s.project_id, now)
        return started

    def _take_lock(self, conn: Connection, s: Step, now: datetime) -> bool:
        project = self._project(conn, s.project_id, lock=True)
        held = project.lock_holder is not None and project.lock_holder != s.id
        if held and project.lock_until is not None and project.lock_until > now:
            return False
        timeout = timedelta(seconds=STEP_SPECS[s.task_type].timeout_s)
        repo.update_project(conn, project, now, lock_holder=s.id, lock_until=now + timeout)
        return True

    def report_success(
        self,
        step_id: uuid.UUID,
        *,
        output_json: dict[str, Any] | None = None,
        output_asset_id: uuid.UUID | None = None,
        cost_actual: Decimal = Decimal(0),
        summary: dict[str, Any] | None = None,
    ) -> Step:
        now = self._clock.now()
        with self._tx() as conn:
            s = self._running(conn, step_id, StepEvent.SUCCEEDED)
            # a local step's configured price counts once, on its one success (a step succeeds once: a retried
            # or redelivered try finds it no longer running); failed tries of a local step cost nothing
            cost_actual += self.local_price(s.task_type)
            done = repo.move_step(
                conn,
                s,
                event=StepEvent.SUCCEEDED,
                to_status=StepStatus.SUCCESS,
                now=now,
                payload=summary,
                finished_at=now,
                progress=100,
                output_json=output_json,
                output_asset_id=output_asset_id,
                cost_actual=s.cost_actual + cost_actual,
                error_code=None,
                error_message=None,
            )
            self._stopped(conn, s, now)
            self._add_cost(conn, s, cost_actual, now)
            if s.task_type is StepType.DELIVERY and output_asset_id is not None:
                project = self._project(conn, s.project_id, lock=True)
                repo.update_project(conn, project, now, result_asset_id=output_asset_id)
            shots = output_json.get("shots") if output_json and base_key(s.step_key) == "plan" else None
            self._advance_project(conn, s.project_id, now, shots=shots if isinstance(shots, int) else None)
            return done

    def attach_generation(self, step_id: uuid.UUID, generation_task_id: uuid.UUID, provider_id: str | None) -> Step:
        """A running vendor step now waits on this generation task (recorded once: the step finishes when the task
        does, and the sweeper leaves its timeout to the generation engine's own reconciliation)."""
        now = self._clock.now()
        with self._tx() as conn:
            s = self._running(conn, step_id, StepEvent.STARTED)
            if s.generation_task_id is not None and s.generation_task_id != generation_task_id:
                raise IllegalState(f"step {s.step_key} already waits on generation {s.generation_task_id}")
            return repo.annotate_step(
                conn, s, now, generation_task_id=generation_task_id, provider_id=provider_id, progress=10
            )

    def note_request_key(self, step_id: uuid.UUID, key: str) -> Step:
        """The idempotency key of the generation a running vendor step is about to create, written first: a try
        cut short before it could record its task is found again by this key (recover by the
        request id before retrying)."""
        now = self._clock.now()
        with self._tx() as conn:
            s = self._running(conn, step_id, StepEvent.STARTED)
            return repo.annotate_step(conn, s, now, provider_request_id=key)

    def due_queues(self, queues: list[str]) -> list[str]:
        """Which of `queues` have a step due now (a worker claims only from those)."""
        with read_conn(self._engine) as conn:
            return repo.due_queues(conn, queues, self._clock.now())

    def waiting_on_generations(self, generation_task_id: uuid.UUID | None = None) -> list[Step]:
        """Running steps whose generation task decides their outcome (or the one waiting on this task)."""
        with read_conn(self._engine) as conn:
            return repo.running_vendor_steps(conn, generation_task_id)

    def outputs(self, project_id: uuid.UUID) -> dict[str, Step]:
        """The project's succeeded steps by key: what an executor may read of the steps before it."""
        with read_conn(self._engine) as conn:
            return {s.step_key: s for s in repo.steps_of(conn, project_id) if s.status is StepStatus.SUCCESS}

    def input_image_key(self, tenant_id: uuid.UUID, asset_id: str) -> str:
        """The stored key of a READY input image of the tenant (a project's photo); NotFound otherwise."""
        try:
            uuid.UUID(str(asset_id))
        except ValueError:
            raise NotFound(f"asset {asset_id!r} not found") from None
        with read_conn(self._engine) as conn:
            (found,) = asset_rows.inputs_of(conn, tenant_id, [str(asset_id)])
        if found is None or found.kind != AssetKind.INPUT_IMAGE.value or found.status != AssetStatus.READY.value:
            raise NotFound(f"asset {asset_id} is not a READY input image of this tenant")
        return found.object_key

    def record_result(
        self,
        tenant_id: uuid.UUID,
        *,
        bucket: str,
        object_key: str,
        size_bytes: int,
        sha256: str | None,
        duration_ms: int | None,
        width: int | None,
        height: int | None,
        pipeline_version: int,
    ) -> uuid.UUID:
        """The asset row of a delivered video (its bytes are already stored); the delivery step reports it."""
        with self._tx() as conn:
            return repo.insert_result_asset(
                conn,
                tenant_id=tenant_id,
                bucket=bucket,
                object_key=object_key,
                size_bytes=size_bytes,
                sha256=sha256,
                duration_ms=duration_ms,
                width=width,
                height=height,
                pipeline_version=pipeline_version,
                now=self._clock.now(),
            )

    def report_failure(
        self, step_id: uuid.UUID, code: ErrorCode, message: str, cost_actual: Decimal = Decimal(0)
    ) -> Step:
        """`cost_actual`: what the try cost anyway (a vendor job billed although it failed), added to the step's
        and the project's actual cost; it was settled by the step's generation task, never here."""
        now = self._clock.now()
        with self._tx() as conn:
            s = self._running(conn, step_id, StepEvent.FAILED_FINAL)
            project = self._project(conn, s.project_id)
            decision = decide_failure(
                STEP_SPECS[s.task_type], s.retry_count, code, now, premium=project.priority == Priority.PREMIUM
            )
            moved = repo.move_step(
                conn,
                s,
                event=decision.event,
                to_status=decision.to_status,
                now=now,
                payload={"reason": decision.reason},
                retry_count=decision.retry_count,
                next_attempt_at=decision.next_attempt_at,
                error_code=code.value,
                error_message=message[:2000],
                finished_at=None if decision.to_status is StepStatus.RETRYING else now,
                cost_actual=s.cost_actual + cost_actual,
            )
            if moved.status is StepStatus.MANUAL_REQUIRED:  # a person decides, from the review queue
                repo.open_review(conn, moved, f"step {moved.step_key}: {decision.reason}", now)
            self._stopped(conn, s, now)
            self._add_cost(conn, s, cost_actual, now)
            self._advance_project(conn, s.project_id, now)
            return moved

    def release(self, step_id: uuid.UUID, reason: str) -> Step:
        """A try stopped from outside (this engine shutting down, Ctrl-C) rather than failed: due again at once,
        its retry budget untouched — an interruption is no verdict on the step (the media sandbox's rule)."""
        now = self._clock.now()
        with self._tx() as conn:
            s = self._running(conn, step_id, StepEvent.RETRY_SCHEDULED)
            moved = repo.move_step(
                conn,
                s,
                event=StepEvent.RETRY_SCHEDULED,
                to_status=StepStatus.RETRYING,
                now=now,
                payload={"reason": reason[:500], "interrupted": True},
                next_attempt_at=now,
            )
            self._stopped(conn, s, now)
            self._advance_project(conn, s.project_id, now)
            return moved

    def retry_step(
        self,
        project_id: uuid.UUID,
        step_key: str,
        tenant_id: uuid.UUID | None = None,
        reason: str | None = None,
        *,
        by: str | None = None,
    ) -> Step:
        """The retry entry (`projects retry-step`): a failed or manual_required step back to pending on the
        same row, with a fresh retry budget. `reason` is kept in the step's history."""
        note = reason[:500] if reason else None
        return self._decide(project_id, step_key, StepEvent.RETRY_REQUESTED, tenant_id, by=by, note=note, retry_count=0)

    def approve_step(
        self,
        project_id: uuid.UUID,
        step_key: str,
        tenant_id: uuid.UUID | None = None,
        *,
        by: str | None = None,
        note: str | None = None,
    ) -> Step:
        return self._decide(project_id, step_key, StepEvent.APPROVED, tenant_id, by=by, note=note)

    def reject_step(
        self,
        project_id: uuid.UUID,
        step_key: str,
        tenant_id: uuid.UUID | None = None,
        *,
        by: str | None = None,
        note: str | None = None,
    ) -> Step:
        return self._decide(project_id, step_key, StepEvent.REJECTED, tenant_id, by=by, note=note)

    def _decide(
        self,
        project_id: uuid.UUID,
        step_key: str,
        event: StepEvent,
        tenant_id: uuid.UUID | None,
        *,
        by: str | None = None,
        note: str | None = None,
        **values: Any,
    ) -> Step:
        with self._tx() as conn:
            return self.decide_in(conn, project_id, step_key, event, tenant_id, by=by, note=note, **values)

    def decide_in(
        self,
        conn: Connection,
        project_id: uuid.UUID,
        step_key: str,
        event: StepEvent,
        tenant_id: uuid.UUID | None = None,
        *,
        by: str | None = None,
        note: str | None = None,
        **values: Any,
    ) -> Step:
        """A retry / approval / rejection inside the caller's transaction (the review queue decides an item and
        its step together); the step's open review item closes with it. The caller signals after its commit."""
        now = self._clock.now()
        self._project(conn, project_id, tenant_id, lock=True)
        s = repo.step_by_key(conn, project_id, step_key)
        if s is None:
            raise NotFound(f"project {project_id} has no step {step_key!r}")
        edge = STEP_MACHINE.edge(s.status, event)
        if edge is None:
            raise IllegalState(f"step {step_key} is {s.status}: {event} is not allowed")
        if edge.target is StepStatus.PENDING:
            values.update(next_attempt_at=now, finished_at=None, started_at=None)
        elif edge.target in (StepStatus.SUCCESS, StepStatus.FAILED):
            values.update(finished_at=now)
        payload = {"by": by, "note": (note or "")[:500]} if by or note else None
        moved = repo.move_step(conn, s, event=event, to_status=edge.target, now=now, payload=payload, **values)
        if s.status is StepStatus.MANUAL_REQUIRED and event in _REVIEW_CLOSED_BY:
            repo.close_review(conn, s.id, _REVIEW_CLOSED_BY[event], now, by, note)
        self._advance_project(conn, project_id, now)
        return moved

    # --- recovery ---------------------------------------------------------------------------------------------

    def sweep_timeouts(self) -> list[Step]:
        """: running steps past their type's timeout fail with TASK_TIMEOUT and are retried by the rules. (A step
        backed by a generation task follows that task instead: the engine reconciles with the provider itself.)"""
        now = self._clock.now()
        with read_conn(self._engine) as conn:
            late = [
                s
                for s in repo.running_steps(conn)
                if s.generation_task_id is None and timed_out(STEP_SPECS[s.task_type], s.started_at, now)
            ]
        moved = []
        for s in late:
            try:
                moved.append(self.report_failure(s.id, ErrorCode.TASK_TIMEOUT, "timed out"))
            except (IllegalState, repo.StaleVersion):
                continue  # it reported in the meantime
        return moved

    def redrive_stale(self) -> list[str]:
        """The sweeper's net for lost wake-ups: queues with a step due longer than `redrive_after_s` get a fresh
        one (the database is the truth, the message only a wake-up). Returns those queues."""
        now = self._clock.now()
        with self._tx() as conn:
            return redrive(conn, now, now - self._redrive_after)

    # --- internals --------------------------------------------------------------------------------------------

    def _project(
        self, conn: Connection, project_id: uuid.UUID, tenant_id: uuid.UUID | None = None, *, lock: bool = False
    ) -> Project:
        project = repo.project(conn, project_id, tenant_id, lock=lock)
        if project is None:
            raise NotFound(f"project {project_id} not found")
        return project

    def _running(self, conn: Connection, step_id: uuid.UUID, event: StepEvent) -> Step:
        s = repo.step(conn, step_id, lock=True)
        if s is None:
            raise NotFound(f"step {step_id} not found")
        if s.status is not StepStatus.RUNNING:
            raise IllegalState(f"step {s.step_key} is {s.status}, not running: {event} ignored")
        return s

    def _add_cost(self, conn: Connection, s: Step, cost: Decimal, now: datetime) -> None:
        """The project's actual cost is the sum of its steps' (each settled once, by its own task)."""
        if cost:
            project = self._project(conn, s.project_id, lock=True)
            repo.update_project(conn, project, now, cost_actual=project.cost_actual + cost)

    def _stopped(self, conn: Connection, s: Step, now: datetime) -> None:
        """`s` stopped running: its project lock is free, and what it held back is woken."""
        self._release_lock(conn, s, now)
        wake_after(conn, s, self._limits, now)

    def _release_lock(self, conn: Connection, s: Step, now: datetime) -> None:
        project = self._project(conn, s.project_id, lock=True)
        if project.lock_holder == s.id:
            repo.update_project(conn, project, now, lock_holder=None, lock_until=None)

    def _spawn_ready(self, conn: Connection, project: Project, now: datetime) -> None:
        wf = catalog.get(project.workflow)
        statuses = {s.step_key: s.status for s in repo.steps_of(conn, project.id)}
        prices: dict[str, Decimal] | None = None
        for key in ready_steps(wf, statuses, project.shots):
            if key in statuses:
                continue
            if prices is None:  # each step row carries its share of the project's estimate
                prices = {c.step: c.credits for c in self.estimate(project.workflow, project.input).steps}
            step_def = wf.step(base_key(key))
            shot = int(key[len(step_def.key) + 1 : -1]) if step_def.per_shot else None
            step_input = {"project": project.input_hash, "step": key, "shot": shot}
            repo.insert_step(
                conn,
                project=project,
                step_key=key,
                task_type=step_def.type,
                input_json=step_input,
                input_hash=input_hash(step_input),
                now=now,
                cost_estimate=prices.get(key, Decimal(0)),
            )

    def _advance_project(
        self, conn: Connection, project_id: uuid.UUID, now: datetime, shots: int | None = None
    ) -> None:
        project = self._project(conn, project_id, lock=True)
        if project.status is ProjectStatus.CANCELLED:
            return
        if shots is not None and project.shots is None:
            project = repo.update_project(conn, project, now, shots=shots)
        self._spawn_ready(conn, project, now)
        wf = catalog.get(project.workflow)
        statuses = {s.step_key: s.status for s in repo.steps_of(conn, project_id)}
        target = derive_status(wf, statuses, project.shots)
        if target is ProjectStatus.CREATED and project.status is not ProjectStatus.CREATED:
            target = ProjectStatus.RUNNING  # its first step was retried: work goes on, the project is not new
        event = project_event(project.status, target)
        if event is None:
            return
        values: dict[str, Any] = {"status": target.value}
        if event is ProjectEvent.ALL_DONE:
            values["finished_at"] = now
        repo.update_project(conn, project, now, **values)
