"""/v1/generations: create (idempotent), read, list, cancel."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from starlette.concurrency import run_in_threadpool

from aivedio_engine.api.deps import Auth, Ctx
from aivedio_engine.api.validation import KEY_SCHEMA, Text
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.domain.requests import (
    MAX_ASSETS,
    MAX_OUTPUTS,
    MAX_PROMPT_CHARS,
    MIN_DEADLINE_S,
    PRIORITY_RANGE,
    SEED_MAX,
)
from aivedio_engine.domain.status import USER_STAGE, TaskStatus
from aivedio_engine.services.outputs import OutputFile
from aivedio_engine.services.task_view import TaskView

router = APIRouter(prefix="/v1/generations", tags=["generations"])
#: states in which derivatives exist (a reviewer may look at a held output; the client gets it once approved)
_PLAYABLE = frozenset({TaskStatus.SUCCEEDED.value})
# schema-only: the service checks it (its message listing the statuses is API)
_STATUS_SCHEMA = {"enum": [s.value for s in TaskStatus]}


class GenerationRequest(BaseModel):
    """What a client may ask for; `GET /v1/models` lists valid models, resolutions and durations (the OpenAPI
    schema states them too: api/openapi.py fills in this deployment's catalog)."""

    model_config = ConfigDict(extra="forbid")

    prompt: Text = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    model: Text = Field(min_length=1, max_length=64)
    provider: Text | None = Field(default=None, min_length=1, max_length=64)
    asset_ids: list[uuid.UUID] | None = Field(default=None, max_length=MAX_ASSETS)
    duration_s: StrictInt | None = Field(default=None, ge=1)
    aspect_ratio: Text | None = Field(default=None, max_length=16)
    resolution: Text | None = Field(default=None, max_length=32)
    seed: StrictInt | None = Field(default=None, ge=0, le=SEED_MAX)
    priority: StrictInt | None = Field(default=None, ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1])
    deadline_s: StrictInt | None = Field(
        default=None,
        ge=MIN_DEADLINE_S,
        description="Seconds until the provider must have produced the video, else EXPIRED (charged as the "
        "provider billed, like a cancel); once it exists, fetch, media and review run on their own budgets.",
    )
    #: outputs (variants) to make, 1-4 up to the model's `max_outputs`; part of the request and its hash
    # the range is the domain's to check (its 422 names the model's own limit); the schema only states it
    n: StrictInt | None = Field(default=None, json_schema_extra={"minimum": 1, "maximum": MAX_OUTPUTS})


class OutputAsset(BaseModel):
    id: uuid.UUID
    size_bytes: int | None
    sha256: str | None


class GenerationVariant(BaseModel):
    """One output of a request for `n`: its playback URLs and their asset rows, as `outputs`/`output_assets`."""

    index: int
    outputs: dict[str, str] = Field(default_factory=dict)
    output_assets: dict[str, OutputAsset] = Field(default_factory=dict)


class Generation(BaseModel):
    id: uuid.UUID
    status: str
    #: the status in a user's words; "generated, processing" from the moment the provider's video exists
    stage: str
    version: int
    progress: int
    model: str
    provider: str | None
    priority: int
    estimated_cost: str
    actual_cost: str | None
    cancel_outcome: str | None
    error_class: str | None
    parked_reason: str | None
    params: dict[str, Any]
    deadline_at: str | None
    created_at: str
    updated_at: str
    finished_at: str | None
    links: dict[str, str]
    #: signed, expiring playback URLs of the READY derivatives (proxy_mp4, hls, thumbnail, waveform)
    outputs: dict[str, str] = Field(default_factory=dict)
    #: the asset row behind each of `outputs` (same keys): its id, size and SHA-256, so a download can be checked
    #: (for `hls` these describe the stored playlist, i.e. the served one with each signed URL put back to its
    #: file name)
    output_assets: dict[str, OutputAsset] = Field(default_factory=dict)
    #: every output of the request (`n`), by index; `outputs` above is the first one's
    variants: list[GenerationVariant] = Field(default_factory=list)


class GenerationPage(BaseModel):
    data: list[Generation]
    next_cursor: str | None


def views(ctx: AppContext, request: Request, tenant_id: uuid.UUID, tasks: Sequence[TaskView]) -> list[Generation]:
    """What the API answers about `tasks` (the create and its replay, GET, the list, the lookup by key, cancel):
    each task, and once SUCCEEDED its outputs — signed URLs, their asset rows, every variant — all tasks' read in
    one statement. Reads the database only when one of them is SUCCEEDED."""
    playable = [t.id for t in tasks if t.status in _PLAYABLE]
    produced = ctx.outputs.of_tasks(tenant_id, playable) if playable else {}
    base = (ctx.settings.api.public_base_url or str(request.base_url)).rstrip("/") if produced else ""

    def signed(task_id: uuid.UUID, files: dict[str, OutputFile]) -> tuple[dict[str, str], dict[str, OutputAsset]]:
        # links served by this API (fs objects, HLS playlists) come as paths: made absolute for players
        urls = {p: base + u if u.startswith("/") else u for p, u in ctx.outputs.urls(tenant_id, task_id, files).items()}
        described = {
            p: OutputAsset(id=f.asset_id, size_bytes=f.size_bytes, sha256=f.sha256)
            for p, f in files.items()
            if p in urls
        }
        return urls, described

    found = []
    for task in tasks:
        out = produced.get(task.id)
        urls, described = signed(task.id, out.files) if out else ({}, {})
        variants = [
            GenerationVariant(index=v.index, outputs=v_urls, output_assets=v_described)
            for v in (out.variants if out else [])
            for v_urls, v_described in [signed(task.id, v.files)]
        ]
        found.append(_render(task, urls, described, variants))
    return found


def _render(
    task: TaskView,
    outputs: dict[str, str],
    output_assets: dict[str, OutputAsset],
    variants: list[GenerationVariant],
) -> Generation:
    base = f"/v1/generations/{task.id}"
    return Generation(
        id=task.id,
        status=task.status,
        stage=USER_STAGE[TaskStatus(task.status)],
        version=task.version,
        progress=task.progress,
        model=task.model,
        provider=task.provider,
        priority=task.priority,
        estimated_cost=str(task.estimated_cost),
        actual_cost=None if task.actual_cost is None else str(task.actual_cost),
        cancel_outcome=task.cancel_outcome,
        error_class=task.last_error_class,
        parked_reason=task.parked_reason,
        params=task.params,
        deadline_at=_iso(task.deadline_at),
        created_at=_iso(task.created_at) or "",
        updated_at=_iso(task.updated_at) or "",
        finished_at=_iso(task.finished_at),
        links={"self": base, "events": f"{base}/events", "cancel": f"{base}/cancel"},
        outputs=outputs,
        output_assets=output_assets,
        variants=variants,
    )


def _iso(value: Any) -> str | None:
    return None if value is None else value.isoformat()


@router.post("", status_code=202, response_model=Generation)
async def create_generation(
    request: Request,
    ctx: Ctx,
    principal: Auth,
    body: Annotated[GenerationRequest, Body()],
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", json_schema_extra=KEY_SCHEMA)] = None,
) -> Response:
    """Create a generation. The same Idempotency-Key with the same request returns the original task."""
    trace_id = getattr(request.state, "request_id", None)
    content, headers = await accept(ctx, request, principal.tenant_id, idempotency_key, body, trace_id)
    return Response(content, 202, headers, media_type="application/json")


async def accept(
    ctx: AppContext,
    request: Request,
    tenant_id: uuid.UUID,
    idempotency_key: str | None,
    body: GenerationRequest,
    trace_id: str | None,
) -> tuple[bytes, dict[str, str]]:
    """The create's 202, body and headers: the route above and its fast path (api/fast_create.py) answer with it."""
    raw = body.model_dump(exclude_none=True, mode="json")
    created = await ctx.loop_create.create(tenant_id, idempotency_key, raw, trace_id)
    headers = {"Location": f"/v1/generations/{created.task.id}"}
    if created.replayed:
        headers["Idempotent-Replayed"] = "true"
    if created.task.status in _PLAYABLE:  # only a replay can be finished: its outputs are a blocking read
        (view,) = await run_in_threadpool(views, ctx, request, tenant_id, [created.task])
    else:  # nothing to read: stays on the loop
        (view,) = views(ctx, request, tenant_id, [created.task])
    # rendered here, not by FastAPI's response_model (kept for the schema): the model is built from our own view,
    # so validating it a second time on the way out only cost CPU on the hottest route
    return view.model_dump_json().encode(), headers


@router.get("/{task_id}", response_model=Generation)
def get_generation(task_id: uuid.UUID, request: Request, ctx: Ctx, principal: Auth) -> Generation:
    (view,) = views(ctx, request, principal.tenant_id, [ctx.generations.get(principal.tenant_id, task_id)])
    return view


@router.get("", response_model=GenerationPage)
def list_generations(
    request: Request,
    ctx: Ctx,
    principal: Auth,
    status: Annotated[Text | None, Query(max_length=32, json_schema_extra=_STATUS_SCHEMA)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: uuid.UUID | None = None,
    idempotency_key: Annotated[str | None, Query(json_schema_extra=KEY_SCHEMA)] = None,
) -> GenerationPage:
    tenant_id = principal.tenant_id
    if idempotency_key is not None:  # at most one task per key: lets a client resume a batch without re-sending
        found = ctx.generations.find_by_key(tenant_id, idempotency_key)
        return GenerationPage(data=views(ctx, request, tenant_id, [found] if found else []), next_cursor=None)
    page, nxt = ctx.generations.list(tenant_id, status=status, limit=limit, cursor=cursor)
    return GenerationPage(data=views(ctx, request, tenant_id, page), next_cursor=None if nxt is None else str(nxt))


@router.post("/{task_id}/cancel", status_code=202, response_model=Generation)
def cancel_generation(task_id: uuid.UUID, request: Request, ctx: Ctx, principal: Auth) -> Generation:
    (view,) = views(ctx, request, principal.tenant_id, [ctx.generations.cancel(principal.tenant_id, task_id)])
    return view
