"""POST /v1/generations without the framework's work per request, when the answer would be the same.

Under load, FastAPI's and Starlette's layers between the server and the create route (middleware, routing,
dependency solving, the Request object, the Response class) took more of the API's CPU than the create itself
(docs/decisions/0011-create-path.md). This middleware answers the one hot route directly when it can answer exactly
as the route does: a key this process verified recently (`TenantService.cached_principal`), a JSON body that
validates as `GenerationRequest`. It then calls the route's own `accept`, so the service call, the body and the
headers are the route's; a service error is rendered by the app's own exception handler. Anything else — an
unknown key, another content type, a body that does not validate — reaches the app untouched (a body already
read is handed on as it came), so every error and every first request keeps the route's exact answer.

It sits inside `RequestId` and `BodyLimit` (the request id, the size cap) and outside Starlette's
`ExceptionMiddleware`; an exception without a handler of its own propagates to `ServerErrorMiddleware`, as the
route's would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aivedio_engine.api.routes.generations import GenerationRequest, accept
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.services.idempotency import checked_key

PATH = "/v1/generations"


class FastCreate:
    def __init__(self, app: ASGIApp, ctx: AppContext, handlers: Mapping[Any, Any]) -> None:
        """`handlers`: the app's exception handlers (`app.exception_handlers`, filled by `problems.install`)."""
        self.app = app
        self._ctx = ctx
        self._handlers = handlers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)  # the first of a repeated header, as Starlette's Headers.get reads it
        principal = self._principal(headers)
        if principal is None or headers.get(b"content-type", b"").split(b";")[0].strip() != b"application/json":
            await self.app(scope, receive, send)
            return
        body = await _read(receive)
        if body is None:  # the client went away before sending its body: nobody to answer
            return
        try:
            request = GenerationRequest.model_validate_json(body)
        except ValidationError:  # the route words the 422 (and tells bad JSON from a bad field)
            await self.app(scope, _replay(body, receive), send)
            return
        state = scope.setdefault("state", {})
        state["tenant_id"] = principal.tenant_id
        try:
            # judged on the bytes that came, as the service judges the route's (decoded as Latin-1: the same verdict)
            raw_key = headers.get(b"idempotency-key")
            key = None if raw_key is None else checked_key(raw_key)
            content, extra = await accept(
                self._ctx, Request(scope), principal.tenant_id, key, request, state.get("request_id")
            )
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            response = await handler(Request(scope), exc)
            await response(scope, receive, send)
            return
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
        raw += [(b"content-length", str(len(content)).encode()), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 202, "headers": raw})
        await send({"type": "http.response.body", "body": content})

    def _principal(self, headers: dict[bytes, bytes]) -> Any:
        """The principal of a bearer key verified recently (`api/deps.get_principal` reads it the same way)."""
        scheme, _, key = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return None
        return self._ctx.tenants.cached_principal(key)

    def _handler(self, exc: Exception) -> Any:
        """The app's handler for `exc`, looked up as Starlette's ExceptionMiddleware does; the catch-all `Exception`
        handler is left to ServerErrorMiddleware, which runs it and logs the error."""
        for cls in type(exc).__mro__:
            if cls is Exception:
                return None
            if cls in self._handlers:
                return self._handlers[cls]
        return None


async def _read(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: only the disconnect is left to wait for

    return replay
