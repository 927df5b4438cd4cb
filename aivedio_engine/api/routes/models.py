"""/v1/models: what a client needs to build a valid request (provider, model, limits, prices)."""

from __future__ import annotations

from fastapi import APIRouter

from aivedio_engine.api.deps import Auth, Ctx
from aivedio_engine.services.catalog import describe_models

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.get("")
def list_models(ctx: Ctx, principal: Auth) -> dict[str, list[dict[str, object]]]:
    return {"data": describe_models(ctx.catalog)}
