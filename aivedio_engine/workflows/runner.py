"""The System B worker: claim a due step, run its executor, report the outcome.

Only the WorkflowService moves a step or a project; this reports. Work arrives as messages, never by polling:
- `run_due(queue)`: a `workflow.step.due` wake-up of one step queue (`run_step_<queue>` actors): the best due step
  of that queue within the limits is claimed and run. An idle queue is a broker consumer waiting for a message;
  the sweeper re-announces a step whose wake-up was lost (`WorkflowService.redrive_stale`).
- `finish_waiting(task_id)`: a generation task a vendor step waits on (the `clip` step) reached a terminal status
  (its `task.status.changed` message; the sweeper checks them all too): SUCCEEDED → success with the task's
  stored output; FAILED_FINAL / CANCELED / EXPIRED → failure with the System B code of the task's last error
  class (`error_code_for`). Never a fake success: a clip exists only if its generation task succeeded, and its
  credits were reserved and settled by that task alone.

Several workers may run at once: claims skip rows another claimer holds, and a report that lost a race is
dropped (the step moved already). `run_once` runs everything due now in this thread (tests, one-shot tools).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from aivedio_engine.db.workflows import StaleVersion
from aivedio_engine.domain.project_cost import clip_request
from aivedio_engine.domain.status import TaskStatus
from aivedio_engine.domain.workflow import ErrorCode, QueueName, error_code_for
from aivedio_engine.media.derive import MediaInterrupted, job_dir
from aivedio_engine.media.probe import MediaLimits
from aivedio_engine.services.errors import IllegalState, NotFound, ServiceError
from aivedio_engine.testing.failpoints import failpoint
from aivedio_engine.workflows import catalog
from aivedio_engine.workflows.executors import EXECUTORS, Done, Result, Run, StepFailed, Waiting

if TYPE_CHECKING:
    from aivedio_engine.bootstrap import AppContext
    from aivedio_engine.services.workflows import Step

log = logging.getLogger(__name__)

_FAILED_TASK = frozenset({TaskStatus.FAILED_FINAL.value, TaskStatus.CANCELED.value, TaskStatus.EXPIRED.value})
#: the key of the API key behind a step's generation (the engine itself acting for the project's tenant)
_ENGINE_KEY = uuid.UUID(int=0)


class WorkflowRunner:
    def __init__(self, ctx: AppContext, queues: Iterable[str] | None = None) -> None:
        self._ctx = ctx
        self.queues = sorted(queues) if queues else [q.value for q in QueueName]
        self._limits = MediaLimits.from_settings(ctx.settings.media)

    # --- entry points --------------------------------------------------------------------------------------

    def run_due(self, queue: str) -> int:
        """A wake-up of `queue`: claim its best due step (if any may start) and run it; returns 0 or 1."""
        started = self._ctx.workflows.claim([queue], limit=1)
        for step in started:
            self.execute(step)
        return len(started)

    def run_once(self) -> int:
        """One pass over our queues in this thread; returns how many steps it reported or started."""
        done = self.finish_waiting()
        for queue in self._ctx.workflows.due_queues(self.queues):
            done += self.run_due(queue)
        return done

    # --- vendor steps ----------------------------------------------------------------------------------------

    def finish_waiting(self, generation_task_id: uuid.UUID | None = None) -> int:
        """Report the running vendor steps whose generation task ended (only the one waiting on that task, if
        given); returns how many were reported."""
        svc, reported = self._ctx.workflows, 0
        for s in svc.waiting_on_generations(generation_task_id):
            assert s.generation_task_id is not None
            try:
                project = svc.get(s.project_id).project
                task = self._ctx.generations.get(project.tenant_id, s.generation_task_id)
            except NotFound:
                continue
            try:
                if task.status == TaskStatus.SUCCEEDED.value:
                    original = self._ctx.outputs.original(project.tenant_id, task.id)
                    if original is None:
                        svc.report_failure(s.id, ErrorCode.STORAGE_FAILED, f"generation {task.id} has no output")
                    else:
                        svc.report_success(
                            s.id,
                            output_json={"key": original.key, "generation_task_id": str(task.id)},
                            cost_actual=task.actual_cost or Decimal(0),
                            summary={"provider": task.provider, "generation_task_id": str(task.id)},
                        )
                elif task.status in _FAILED_TASK:
                    code = error_code_for(task.last_error_class)
                    svc.report_failure(
                        s.id,
                        code,
                        f"generation {task.id} ended {task.status}"
                        + (f" ({task.last_error_class})" if task.last_error_class else ""),
                        cost_actual=task.actual_cost or Decimal(0),
                    )
                else:
                    continue
                reported += 1
            except (IllegalState, StaleVersion):
                continue  # another runner reported it first
        return reported

    def _generate(
        self, tenant_id: uuid.UUID, image: Path, prompt: str, duration_s: int, key: str
    ) -> tuple[uuid.UUID, str | None]:
        """Image-to-video through the normal generation path: the shot uploaded as an input asset (the same upload
        path `aivedio generate --image` uses), then a generation created under the step's idempotency key."""
        from aivedio_engine.client import ClientError, EmbeddedClient
        from aivedio_engine.services.tenants import Principal

        client = EmbeddedClient(self._ctx, Principal(tenant_id, _ENGINE_KEY))
        try:
            found = client.find(key)  # a run cut short after its create: the same task, never a second one
            if found is None:
                # the body the project's cost estimate priced (domain/project_cost.py), plus the shot image
                body = clip_request(client.default_model(), prompt, duration_s) | {"asset_ids": [client.upload(image)]}
                found = client.create(body, key)
            snap = client.get(found.id)
        except ClientError as exc:
            code = {
                "insufficient-credits": ErrorCode.QUOTA_NOT_ENOUGH,
                "invalid-request": ErrorCode.INPUT_INVALID,
                "overloaded": ErrorCode.PROVIDER_RATE_LIMIT,
            }.get(exc.kind or "", ErrorCode.PROVIDER_ERROR)
            raise StepFailed(code, str(exc)) from exc
        return uuid.UUID(snap.id), snap.provider

    # --- local steps -------------------------------------------------------------------------------------------

    def execute(self, step: Step) -> None:
        svc = self._ctx.workflows
        started = time.monotonic()
        failpoint("workflow.step_claimed")  # tests kill -9 the worker here: the step is running, no report comes
        try:
            project = svc.get(step.project_id).project
            executor = EXECUTORS.get(step.task_type)
            if executor is None:
                raise StepFailed(ErrorCode.INPUT_INVALID, f"no executor for step type {step.task_type}")
            with job_dir() as workdir:
                run = Run(
                    step=step,
                    project=project,
                    outputs=svc.outputs(project.id),
                    workdir=workdir,
                    store=self._ctx.storage,
                    limits=replace(self._limits, workdir=workdir),
                    generate=self._generate,
                    publish=self._publish,
                    photo_key=lambda: self._photo_key(project.tenant_id, catalog.photo_asset_id(project.input)),
                    note_key=lambda key: self._note_key(step, key),
                    find_live=self._find_live,
                )
                outcome = executor(run)
        except StepFailed as exc:
            self._fail(step, exc.code, exc.message)
            return
        except MediaInterrupted as exc:
            try:
                svc.release(step.id, f"interrupted: {exc.message}")
            except (IllegalState, StaleVersion) as lost:
                log.warning("step %s: release dropped (%s)", step.step_key, lost)
            return
        except Exception as exc:  # an executor bug must end in a recorded failure, not a step left running
            log.exception("step %s of project %s crashed", step.step_key, step.project_id)
            self._fail(step, ErrorCode.UNKNOWN_ERROR, f"{type(exc).__name__}: {exc}")
            return
        try:
            if isinstance(outcome, Waiting):
                svc.attach_generation(step.id, outcome.generation_task_id, outcome.provider)
                # a task that ended before it was attached announced its end to nobody: look once now
                self.finish_waiting(outcome.generation_task_id)
            else:
                assert isinstance(outcome, Done)
                svc.report_success(
                    step.id,
                    output_json=outcome.output,
                    output_asset_id=outcome.asset_id,
                    summary={"duration_ms": int((time.monotonic() - started) * 1000), "queue": step.queue},
                )
        except (IllegalState, StaleVersion) as exc:
            log.warning("step %s: report dropped (%s)", step.step_key, exc)

    def _note_key(self, step: Step, key: str) -> None:
        self._ctx.workflows.note_request_key(step.id, key)

    def _find_live(self, tenant_id: uuid.UUID, key: str) -> tuple[uuid.UUID, str | None] | None:
        task = self._ctx.generations.find_by_key(tenant_id, key)
        if task is None or task.status in _FAILED_TASK:
            return None
        return task.id, task.provider

    def _fail(self, step: Step, code: ErrorCode, message: str) -> None:
        try:
            self._ctx.workflows.report_failure(step.id, code, message)
        except (IllegalState, StaleVersion) as exc:
            log.warning("step %s: failure report dropped (%s)", step.step_key, exc)

    def _photo_key(self, tenant_id: uuid.UUID, asset_id: object) -> str:
        try:
            return self._ctx.workflows.input_image_key(tenant_id, str(asset_id))
        except ServiceError as exc:
            raise StepFailed(ErrorCode.INPUT_INVALID, f"photo: {exc}") from exc

    def _publish(self, tenant_id: uuid.UUID, result: Result) -> uuid.UUID:
        return self._ctx.workflows.record_result(
            tenant_id,
            bucket=self._ctx.storage.bucket,
            object_key=result.key,
            size_bytes=result.size_bytes,
            sha256=result.sha256,
            duration_ms=result.duration_ms,
            width=result.width,
            height=result.height,
            pipeline_version=self._ctx.settings.media.pipeline_version,
        )
