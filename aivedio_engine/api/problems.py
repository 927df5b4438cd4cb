"""RFC 9457 problem details: every error leaves as application/problem+json with a stable `type` URI.

Internal detail (SQL, tracebacks, paths) never reaches the body; the request id does, so a report can be
matched with the logs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from aivedio_engine.db.handles import DBAPIError, OperationalError, PoolTimeout
from aivedio_engine.services import errors

TYPE_BASE = "https://aivedio.dev/problems/"
MEDIA_TYPE = "application/problem+json"
log = logging.getLogger("aivedio.api")

_STATUS: dict[type[errors.ServiceError], int] = {
    errors.NotFound: 404,
    errors.InvalidInput: 422,
    errors.ModerationRejected: 422,
    errors.TooManyStreams: 429,
    errors.RateLimited: 429,
    errors.BadRequest: 400,
    errors.Unauthorized: 401,
    errors.Forbidden: 403,
    errors.PayloadTooLarge: 413,
    errors.IdempotencyKeyReused: 409,
    errors.IdempotencyKeyInFlight: 409,
    errors.IllegalState: 409,
    errors.Conflict: 409,
    errors.InsufficientCredits: 402,
    errors.Unavailable: 503,
}

_HTTP_SLUGS = {
    400: "bad-request",
    401: "unauthorized",
    404: "not-found",
    405: "method-not-allowed",
    413: "payload-too-large",
    415: "unsupported-media-type",
    429: "rate-limited",
}


class Problem(Exception):
    """Raised by route code for errors that are HTTP concerns (auth, headers)."""

    def __init__(
        self,
        status: int,
        slug: str,
        title: str,
        detail: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(title)
        self.status, self.slug, self.title, self.detail = status, slug, title, detail
        self.headers = headers or {}
        self.extra = extra


def problem_response(
    request: Request,
    status: int,
    slug: str,
    title: str,
    detail: str | None = None,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body: dict[str, Any] = {"type": TYPE_BASE + slug, "title": title, "status": status}
    if detail:
        body["detail"] = detail
    body["instance"] = request.url.path
    request_id = getattr(request.state, "request_id", None)
    if request_id:
        body["request_id"] = request_id
    body.update({k: v for k, v in extra.items() if v is not None})
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return problem_response(request, exc.status, exc.slug, exc.title, exc.detail, exc.headers, **exc.extra)

    @app.exception_handler(errors.ServiceError)
    async def _service(request: Request, exc: errors.ServiceError) -> JSONResponse:
        status = next((s for cls, s in _STATUS.items() if isinstance(exc, cls)), 400)
        title = exc.code.replace("-", " ").capitalize()
        retry_after = exc.extra.get("retry_after_s")
        headers = {"Retry-After": str(max(1, math.ceil(retry_after)))} if retry_after is not None else None
        return problem_response(request, status, exc.code, title, str(exc), headers, **exc.extra)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = [{"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", "")} for e in exc.errors()][:20]
        first = errs[0] if errs else {"loc": [], "msg": "invalid request"}
        detail = f"{'.'.join(first['loc'][1:] or first['loc'])}: {first['msg']}"
        return problem_response(request, 422, "invalid-request", "Invalid request", detail, errors=errs)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        slug = _HTTP_SLUGS.get(exc.status_code, "http-error")
        return problem_response(request, exc.status_code, slug, str(exc.detail), headers=exc.headers)

    @app.exception_handler(OperationalError)
    @app.exception_handler(PoolTimeout)
    # the create path's pipeline runs on the raw psycopg connection: a cut there is psycopg's own error
    @app.exception_handler(psycopg.OperationalError)
    async def _db_down(request: Request, exc: Exception) -> JSONResponse:
        return problem_response(
            request,
            503,
            "database-unavailable",
            "Database unavailable",
            "the request was not processed; retry with the same Idempotency-Key",
            headers={"Retry-After": "2"},
        )

    @app.exception_handler(DBAPIError)
    async def _db_error(request: Request, exc: DBAPIError) -> JSONResponse:
        if exc.connection_invalidated:
            return problem_response(
                request, 503, "database-unavailable", "Database unavailable", headers={"Retry-After": "2"}
            )
        log.error("database error", exc_info=exc)
        return problem_response(request, 500, "internal-error", "Internal error")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # the body says nothing; the log says everything, under the same request id
        log.error("unhandled error", exc_info=exc, extra={"request_id": getattr(request.state, "request_id", None)})
        return problem_response(request, 500, "internal-error", "Internal error")
