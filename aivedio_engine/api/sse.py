"""The HTTP side of the event streams: admission (stream slots), headers, and slow-consumer eviction.

Streams are pulled: the route's frame iterator is only asked for the next frame once the previous write has been
handed to the socket, so a client that reads slowly never makes this process queue frames for it. What it has
missed is read again from the database, in one batch, when it catches up (the stream's own coalescing). The only
bytes held for a connection are those of the one write in flight plus the server's transport buffer (bounded by
its high-water mark): when that write has not drained within `api.sse_send_timeout_s` the client has stopped
reading with a full socket, and the stream is evicted — its slot, its notifier subscription and its reads end
at once; the server closes the connection (uvicorn notes the incomplete response in its log).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from aivedio_engine.services.stream_slots import StreamSlot, StreamSlots

MEDIA_TYPE = "text/event-stream"
#: comment lines are ignored by EventSource; they only keep proxies and load balancers from idling us out
PING = ": ping\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

log = logging.getLogger(__name__)
T = TypeVar("T")


class EventStreamResponse(StreamingResponse):
    """A StreamingResponse that gives its slot back however it ends, and evicts a client that stops reading."""

    def __init__(self, frames: AsyncIterator[str], slot: StreamSlot, slots: StreamSlots, send_timeout_s: float) -> None:
        super().__init__(frames, media_type=MEDIA_TYPE, headers=HEADERS)
        self._frames = frames
        self._slot = slot
        self._slots = slots
        self._send_timeout_s = send_timeout_s

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for frame in self._frames:
            body = frame.encode(self.charset)
            try:
                await asyncio.wait_for(
                    send({"type": "http.response.body", "body": body, "more_body": True}), self._send_timeout_s
                )
            except TimeoutError:
                self._slots.note_evicted()
                log.warning("event stream evicted: a write did not drain in %.1f s", self._send_timeout_s)
                await _close(self._frames)
                return  # no final chunk: it could not drain either
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slot.release()
            await _close(self._frames)


async def open_event_stream(
    slots: StreamSlots,
    tenant_id: uuid.UUID,
    send_timeout_s: float,
    open_stream: Callable[[], Awaitable[T]],
    render: Callable[[T], AsyncIterator[str]],
) -> EventStreamResponse:
    """Admit the stream (429 beyond a cap), open it (its own errors, e.g. 404, before any byte), and wrap it."""
    slot = slots.acquire(tenant_id)
    try:
        stream = await open_stream()
    except BaseException:
        slot.release()
        raise
    return EventStreamResponse(render(stream), slot, slots, send_timeout_s)


async def _close(frames: AsyncIterator[str]) -> None:
    aclose = getattr(frames, "aclose", None)
    if aclose is not None:
        await aclose()
