"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from aivedio_engine.api.deps import Ctx
from aivedio_engine.services.health import database_ready

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(ctx: Ctx) -> JSONResponse:
    """The database answers; 503 otherwise."""
    ok, detail = database_ready(ctx.engine)
    return JSONResponse({"status": "ok" if ok else "unavailable", "database": detail}, status_code=200 if ok else 503)
