"""The FastAPI app factory and the `api` process role.

The app holds an AppContext and nothing else; route modules parse, call one service, and render.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aivedio_engine import __version__
from aivedio_engine.api import openapi, problems
from aivedio_engine.api.fast_create import FastCreate
from aivedio_engine.api.routes import callbacks, events, generations, health, metrics, models, playback
from aivedio_engine.bootstrap import AppContext

#: paths whose bodies are streamed uploads, capped by the upload's own declared size instead
STREAMED_PREFIXES = ("/v1/uploads/", "/v1/callbacks/")


def create_app(ctx: AppContext) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await ctx.loop_create.open()  # creates run on this loop from now on (services/loop_create.py)
        try:
            yield
        finally:
            await ctx.loop_create.close()

    app = FastAPI(
        lifespan=lifespan,
        title="aivedio",
        version=__version__,
        description="Orchestration engine for AI video generation.",
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.ctx = ctx
    problems.install(app)
    openapi.install(app, ctx.catalog)
    app.include_router(health.router)
    app.include_router(generations.router)
    app.include_router(events.router)
    app.include_router(models.router)
    app.include_router(callbacks.router)
    app.include_router(playback.router)
    app.include_router(metrics.router)
    for router in _optional_routers():
        app.include_router(router)
    # innermost of the three: the create route's fast path sees the request id and the size cap already applied
    app.add_middleware(FastCreate, ctx=ctx, handlers=app.exception_handlers)
    app.add_middleware(BodyLimit, max_bytes=ctx.settings.api.max_body_bytes)
    app.add_middleware(RequestId)
    return app


def _optional_routers() -> list:
    from aivedio_engine.api.routes import assets, projects, webhook_endpoints

    return [assets.router, *getattr(assets, "extra_routers", []), webhook_endpoints.router, projects.router]


class RequestId:
    """Every response carries X-Request-Id: the caller's (if sane) or a new one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if 0 < len(given) <= 128 and given.isprintable() else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", []).append((b"x-request-id", request_id.encode()))
            await send(message)

        # the request id is the trace id of every line logged while serving it (uvicorn's access line included)
        with structlog.contextvars.bound_contextvars(trace_id=request_id):
            await self.app(scope, receive, send_with_id)


class BodyLimit:
    """Refuse bodies over the cap with 413 — by Content-Length up front; a body without one (chunked) is read
    here, up to the cap, before the app sees any of it: an error raised from inside the app's own body read would
    come out as FastAPI's 400 "error parsing the body" instead."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(STREAMED_PREFIXES):
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.max_bytes:
                await _send_413(scope, send)
                return
            await self.app(scope, receive, send)  # the server holds the body to its declared length
            return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: nobody to answer
                return
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                await _send_413(scope, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: only the disconnect is left to wait for

        await self.app(scope, replay, send)


async def _send_413(scope: Scope, send: Send) -> None:
    body = b'{"type":"' + problems.TYPE_BASE.encode() + b'payload-too-large","title":"Payload too large","status":413}'
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", problems.MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def serve_api(ctx: AppContext, host: str, port: int, stop: threading.Event | None = None) -> None:
    """Run the API with uvicorn until `stop` is set (or SIGINT/SIGTERM when run in the main thread)."""
    import uvicorn

    # log_config=None: uvicorn's records go through the process's (structured, masking) logging setup
    config = uvicorn.Config(
        create_app(ctx),
        host=host,
        port=port,
        log_config=None,
        log_level=None,
        access_log=ctx.settings.logging.access_log,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    if stop is not None:

        def _watch() -> None:
            stop.wait()
            server.should_exit = True

        threading.Thread(target=_watch, name="api-stop", daemon=True).start()
    server.run()
