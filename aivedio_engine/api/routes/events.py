"""GET /v1/generations/{id}/events: status changes as Server-Sent Events.

Each event is one applied transition: `id:` is the task version, so a client that reconnects with
`Last-Event-ID` resumes exactly after what it saw. The stream ends after the terminal status; a client that
wants certainty about the current state asks `GET /v1/generations/{id}`, which is the source of truth.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse

from aivedio_engine.api.deps import Auth, Ctx
from aivedio_engine.api.sse import MEDIA_TYPE, PING, open_event_stream
from aivedio_engine.api.validation import MAX_BIGINT
from aivedio_engine.services import notifications

router = APIRouter(prefix="/v1/generations", tags=["generations"])


@router.get(
    "/{task_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {"content": {MEDIA_TYPE: {}}, "description": "an event stream"},
        429: {"description": "too many open streams (this tenant's or this server's cap); see Retry-After"},
    },
)
async def generation_events(
    task_id: uuid.UUID,
    ctx: Ctx,
    principal: Auth,
    last_event_id: Annotated[int | None, Header(alias="Last-Event-ID", ge=0, le=MAX_BIGINT)] = None,
    last_event_id_query: Annotated[int | None, Query(alias="last_event_id", ge=0, le=MAX_BIGINT)] = None,
) -> StreamingResponse:
    # the header wins: EventSource sends it on reconnect while the URL still carries the first query
    after = last_event_id if last_event_id is not None else last_event_id_query
    api = ctx.settings.api
    return await open_event_stream(
        ctx.stream_slots,
        principal.tenant_id,
        api.sse_send_timeout_s,
        lambda: notifications.open_stream(
            ctx.engine, ctx.notifier, principal.tenant_id, task_id, after, api.sse_heartbeat_s, api.sse_max_batch_events
        ),
        _render,
    )


async def _render(stream: AsyncIterator[list[dict[str, Any]] | None]) -> AsyncIterator[str]:
    async for batch in stream:
        if batch is None:  # nothing changed for a heartbeat interval
            yield PING
        else:
            yield "".join(
                f"id: {e['version']}\nevent: status\ndata: {json.dumps(e, separators=(',', ':'))}\n\n" for e in batch
            )
