"""POST /v1/callbacks/{provider}: the provider's webhook endpoint (authenticated by its signature, not a key)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from aivedio_engine.api.deps import Ctx
from aivedio_engine.api.problems import Problem

router = APIRouter(prefix="/v1/callbacks", tags=["callbacks"])


@router.post("/{provider}", status_code=200)
async def receive_callback(provider: str, request: Request, ctx: Ctx) -> JSONResponse:
    cap = ctx.settings.webhooks.max_body_bytes
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > cap:
            raise Problem(413, "payload-too-large", "Payload too large", f"callback bodies are capped at {cap} bytes")
    headers = {k: v for k, v in request.headers.items()}
    token = request.query_params.get("aivedio_token")
    if token is not None:
        # vendors without signed callbacks (Kling) call back on a URL carrying a per-job HMAC token
        headers["x-aivedio-callback-token"] = token
    from starlette.concurrency import run_in_threadpool

    result = await run_in_threadpool(ctx.callbacks.receive, provider, headers, bytes(body))
    return JSONResponse({"received": result.received, "stored": result.stored})
