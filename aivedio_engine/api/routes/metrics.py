"""`GET /metrics`: Prometheus text exposition of the capacity signals.

No API key: scrapers rarely carry one, and the answer holds aggregates only — counts and ages labelled by status,
provider, queue and alert rule, never a tenant, a prompt or a URL. A deployment whose API is public should still
keep `/metrics` to its internal network at the proxy; `metrics.enabled = false` answers 404.
"""

from __future__ import annotations

import threading

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from aivedio_engine.api.deps import Ctx
from aivedio_engine.api.problems import Problem
from aivedio_engine.observability.metrics import build_registry, render

router = APIRouter(tags=["metrics"])
_lock = threading.Lock()


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, ctx: Ctx) -> Response:
    if not ctx.settings.metrics.enabled:
        raise Problem(404, "not-found", "Not found")
    state = request.app.state
    with _lock:  # one registry (and one database collector, with its cache) per app
        registry = getattr(state, "metrics_registry", None)
        if registry is None:
            registry = state.metrics_registry = build_registry(ctx)
    return Response(render(registry), media_type=CONTENT_TYPE_LATEST)
