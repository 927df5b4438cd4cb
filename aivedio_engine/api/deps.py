"""Request-scoped dependencies: the app context and the authenticated principal."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from aivedio_engine.api.problems import Problem
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.services.tenants import Principal


# Both are `async def` so FastAPI does not hop to its thread pool for them: a recently verified key is answered
# from the in-process cache on the event loop; only a cache miss reads the database, in the pool.
async def get_ctx(request: Request) -> AppContext:
    return request.app.state.ctx


async def get_principal(request: Request) -> Principal:
    """Bearer API key → tenant. Anything else is a 401 that says nothing about why."""
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    principal = None
    if scheme.lower() == "bearer" and key.strip():
        tenants = request.app.state.ctx.tenants
        principal = tenants.cached_principal(key.strip()) or await run_in_threadpool(tenants.authenticate, key.strip())
    if principal is None:
        raise Problem(
            401,
            "unauthorized",
            "Unauthorized",
            "a valid API key is required",
            headers={"WWW-Authenticate": 'Bearer realm="aivedio"'},
        )
    request.state.tenant_id = principal.tenant_id
    return principal


Ctx = Annotated[AppContext, Depends(get_ctx)]
Auth = Annotated[Principal, Depends(get_principal)]
