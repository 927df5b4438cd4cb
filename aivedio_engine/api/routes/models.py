"""/v1/models: what a client needs to build a valid request (provider, model, limits, prices)."""

from __future__ import annotations

from fastapi import APIRouter

from aivedio_engine.api.deps import Auth, Ctx
from aivedio_engine.domain.requests import ASPECT_RATIOS

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.get("")
def list_models(ctx: Ctx, principal: Auth) -> dict[str, list[dict[str, object]]]:
    return {
        "data": [
            {
                "provider": m.provider,
                "model": m.model,
                "max_duration_s": m.max_duration_s,
                "default_duration_s": m.default_duration_s,
                "resolutions": list(m.resolutions),
                "aspect_ratios": list(ASPECT_RATIOS),
                "price_per_second": {r: str(p) for r, p in m.price_per_second.items()},
            }
            for m in ctx.catalog.models
        ]
    }
