"""/v1/projects: System B projects — create idempotently, read with their steps, list, cancel, the
retry entry of a step, and an SSE stream of step and project changes."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from decimal import Decimal
from typing import Annotated

from fastapi import APIRouter, Body, Header, Path, Query, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from aivedio_engine.api.deps import Auth, Ctx
from aivedio_engine.api.sse import MEDIA_TYPE, PING, open_event_stream
from aivedio_engine.api.validation import KEY_SCHEMA
from aivedio_engine.domain.admission import capped_tier
from aivedio_engine.domain.status import AssetStatus
from aivedio_engine.services import project_events
from aivedio_engine.services.errors import InvalidInput, NotFound
from aivedio_engine.services.idempotency import checked_key
from aivedio_engine.services.project_events import StreamEvent
from aivedio_engine.services.workflows import Project, ProjectView, Step
from aivedio_engine.workflows import catalog

router = APIRouter(prefix="/v1/projects", tags=["projects"])
#: a step instance key: `plan`, `image[2]`
STEP_KEY = r"^[a-z_]{1,48}(\[[0-9]{1,4}\])?$"


class ProjectInput(BaseModel):
    """What the `photo_story` workflow works from: one READY image asset (`POST /v1/assets`) and a short script."""

    model_config = ConfigDict(extra="forbid")

    photo_asset_id: uuid.UUID
    script: str = Field(min_length=1, max_length=4000)


class ProjectRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workflow: str = Field(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$", examples=["photo_story"])
    #: the client's end user the project is for; one open formal project per user at a time
    user_ref: str = Field(min_length=1, max_length=128)
    input: ProjectInput
    #: a paid, final production rather than a preview (the per-user limit counts these)
    formal: bool = False
    #: 1 premium custom, 2 paid formal, 3 preview, 4 free preview, 5 cleanup; 1 is served first.
    #: Absent: 2 for a formal project, 3 for a preview. Never better than the tenant's own tier (it caps it).
    priority: int | None = Field(default=None, ge=1, le=5)


class StepOut(BaseModel):
    key: str
    type: str
    queue: str
    status: str
    progress: int
    retry_count: int
    max_retry: int
    next_attempt_at: str | None
    error_code: str | None
    error_message: str | None
    output_asset_id: uuid.UUID | None
    generation_task_id: uuid.UUID | None
    cost_estimate: str
    cost_actual: str
    created_at: str
    started_at: str | None
    finished_at: str | None
    #: from start to finish (or to now, while running); None before it started
    duration_s: float | None
    links: dict[str, str]


class ProjectOut(BaseModel):
    id: uuid.UUID
    workflow: str
    user_ref: str
    status: str
    version: int
    priority: int
    formal: bool
    shots: int | None
    cost_estimate: str
    #: the sum of the steps' settled costs (each step is settled once, through its own generation task)
    cost_actual: str
    result_asset_id: uuid.UUID | None
    error_code: str | None
    created_at: str
    updated_at: str
    finished_at: str | None
    links: dict[str, str]
    #: empty in lists; `GET /v1/projects/{id}` gives every step instance created so far
    steps: list[StepOut] = Field(default_factory=list)


class ProjectPage(BaseModel):
    data: list[ProjectOut]
    next_cursor: str | None


def _money(value: Decimal) -> str:
    return format(value, "f")  # str() of a stored zero is "0E-8"


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _step(p: Project, s: Step, now: datetime) -> StepOut:
    end = s.finished_at or (now if s.started_at is not None else None)
    return StepOut(
        key=s.step_key,
        type=s.task_type.value,
        queue=s.queue,
        status=s.status.value,
        progress=s.progress,
        retry_count=s.retry_count,
        max_retry=s.max_retry,
        next_attempt_at=_iso(s.next_attempt_at),
        error_code=s.error_code,
        error_message=s.error_message,
        output_asset_id=s.output_asset_id,
        generation_task_id=s.generation_task_id,
        cost_estimate=_money(s.cost_estimate),
        cost_actual=_money(s.cost_actual),
        created_at=_iso(s.created_at) or "",
        started_at=_iso(s.started_at),
        finished_at=_iso(s.finished_at),
        duration_s=None if s.started_at is None or end is None else round((end - s.started_at).total_seconds(), 3),
        links={"retry": f"/v1/projects/{p.id}/steps/{s.step_key}/retry"},
    )


def render(p: Project, steps: list[Step] | None = None, now: datetime | None = None) -> ProjectOut:
    base = f"/v1/projects/{p.id}"
    actual = sum((s.cost_actual for s in steps), Decimal(0)) if steps else p.cost_actual
    return ProjectOut(
        id=p.id,
        workflow=p.workflow,
        user_ref=p.user_ref,
        status=p.status.value,
        version=p.version,
        priority=p.priority,
        formal=p.formal,
        shots=p.shots,
        cost_estimate=_money(p.cost_estimate),
        cost_actual=_money(actual),
        result_asset_id=p.result_asset_id,
        error_code=p.error_code,
        created_at=_iso(p.created_at) or "",
        updated_at=_iso(p.updated_at) or "",
        finished_at=_iso(p.finished_at),
        links={"self": base, "events": f"{base}/events", "cancel": f"{base}/cancel"},
        steps=[_step(p, s, now or p.updated_at) for s in steps or []],
    )


def _view(view: ProjectView, now: datetime) -> ProjectOut:
    return render(view.project, view.steps, now)


@router.post("", status_code=201, response_model=ProjectOut)
def create_project(
    response: Response,
    ctx: Ctx,
    principal: Auth,
    body: Annotated[ProjectRequest, Body()],
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", json_schema_extra=KEY_SCHEMA)] = None,
) -> ProjectOut:
    """Create a project. The same Idempotency-Key with the same request returns the original project
    (`Idempotent-Replayed: true`); with another request it is a 409."""
    key = checked_key(idempotency_key)  # required here: a retried request must not make two
    if body.workflow not in catalog.WORKFLOWS:
        known = ", ".join(sorted(catalog.WORKFLOWS))
        raise InvalidInput(f"workflow: unknown workflow {body.workflow!r} (known: {known})", field="workflow")
    try:
        photo = ctx.assets.get(principal, body.input.photo_asset_id)
    except NotFound:
        photo = None
    if photo is None or photo.status != AssetStatus.READY.value:
        raise InvalidInput(
            f"input.photo_asset_id: asset {body.input.photo_asset_id} is not a READY asset of yours",
            field="input.photo_asset_id",
        )
    project, created = ctx.workflows.create(
        principal.tenant_id,
        body.workflow,
        user_ref=body.user_ref,
        input=body.input.model_dump(mode="json"),
        idempotency_key=key,
        formal=body.formal,
        priority=capped_tier(body.priority or (2 if body.formal else 3), ctx.tenant_limits.tier(principal.tenant_id)),
    )
    if not created:
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"/v1/projects/{project.id}"
    return _view(ctx.workflows.get(project.id, principal.tenant_id), ctx.clock.now())


@router.get("/{project_id}", response_model=ProjectOut)
def get_project(project_id: uuid.UUID, ctx: Ctx, principal: Auth) -> ProjectOut:
    return _view(ctx.workflows.get(project_id, principal.tenant_id), ctx.clock.now())


@router.get("", response_model=ProjectPage)
def list_projects(
    ctx: Ctx,
    principal: Auth,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: uuid.UUID | None = None,
) -> ProjectPage:
    rows = ctx.workflows.list_projects(principal.tenant_id, limit + 1, cursor)
    page = rows[:limit]
    nxt = str(page[-1].id) if len(rows) > limit else None
    return ProjectPage(data=[render(p) for p in page], next_cursor=nxt)


@router.post("/{project_id}/cancel", response_model=ProjectOut)
def cancel_project(project_id: uuid.UUID, ctx: Ctx, principal: Auth) -> ProjectOut:
    """Open steps are cancelled with the project; cancelling a cancelled project is harmless, a finished one 409."""
    ctx.workflows.cancel(project_id, principal.tenant_id)
    return _view(ctx.workflows.get(project_id, principal.tenant_id), ctx.clock.now())


@router.post("/{project_id}/steps/{step_key}/retry", response_model=ProjectOut)
def retry_step(
    project_id: uuid.UUID,
    step_key: Annotated[str, Path(pattern=STEP_KEY, max_length=64)],
    ctx: Ctx,
    principal: Auth,
) -> ProjectOut:
    """The retry entry: a failed or manual_required step back to pending on the same row, with a
    fresh retry budget; any other status is a 409 naming it."""
    ctx.workflows.retry_step(project_id, step_key, principal.tenant_id, by=f"api-key:{principal.key_id}")
    return _view(ctx.workflows.get(project_id, principal.tenant_id), ctx.clock.now())


@router.get(
    "/{project_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {"content": {MEDIA_TYPE: {}}, "description": "an event stream"},
        429: {"description": "too many open streams (this tenant's or this server's cap); see Retry-After"},
    },
)
async def project_events_stream(
    project_id: uuid.UUID,
    ctx: Ctx,
    principal: Auth,
    last_event_id: Annotated[int | None, Header(alias="Last-Event-ID", ge=0)] = None,
    last_event_id_query: Annotated[int | None, Query(alias="last_event_id", ge=0)] = None,
) -> StreamingResponse:
    """A `snapshot` of the project first (fresh streams only), then its history: `step` events (a step's
    transition) and `project` events (a change of its status), `id:` = the project's event sequence number
    (resume with Last-Event-ID); `: ping` heartbeats; ends at a terminal status."""
    after = last_event_id if last_event_id is not None else last_event_id_query
    api = ctx.settings.api
    return await open_event_stream(
        ctx.stream_slots,
        principal.tenant_id,
        api.sse_send_timeout_s,
        lambda: project_events.open_stream(
            ctx.engine,
            ctx.notifier,
            principal.tenant_id,
            project_id,
            after,
            api.sse_heartbeat_s,
            api.sse_max_batch_events,
        ),
        _render,
    )


async def _render(stream: AsyncIterator[list[StreamEvent] | None]) -> AsyncIterator[str]:
    async for batch in stream:
        if batch is None:
            yield PING
            continue
        out = []
        for e in batch:
            data = json.dumps(e.data, separators=(",", ":"))
            head = f"id: {e.seq}\n" if e.seq is not None else ""
            out.append(f"{head}event: {e.kind}\ndata: {data}\n\n")
        yield "".join(out)
