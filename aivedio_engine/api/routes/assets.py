"""/v1/assets (create upload, complete, read) and the fs store's signed upload/download endpoints.

`/v1/uploads/{id}` and `/v1/objects/{key}` need no API key: the HMAC signature in the query string is the
credential, so they answer 403 (not 401) when it is wrong or expired. Upload bodies are streamed to the store
(the app's JSON body cap does not apply to `/v1/uploads/`; the declared size does).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import IO, Any

import anyio.from_thread
from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from aivedio_engine.api.deps import Auth, Ctx
from aivedio_engine.api.problems import Problem
from aivedio_engine.api.validation import MAX_BIGINT, Text
from aivedio_engine.services.assets import CONTENT_TYPES, AssetView, PartUrls, RateLimited
from aivedio_engine.services.errors import Forbidden, PayloadTooLarge
from aivedio_engine.storage.base import CHUNK, UploadTarget, content_disposition

router = APIRouter(prefix="/v1/assets", tags=["assets"])
files_router = APIRouter(tags=["uploads"])
extra_routers = [files_router]


class CreateAssetRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: a display name only, cleaned by the service (control and surrogate characters dropped): a file name from
    #: a client's disk may hold bytes that are not UTF-8, which is no reason to refuse the upload
    filename: str = Field(min_length=1, max_length=255)
    size_bytes: StrictInt = Field(ge=1, le=MAX_BIGINT)
    content_type: Text = Field(min_length=1, max_length=128, json_schema_extra={"enum": list(CONTENT_TYPES)})
    sha256: Text | None = Field(default=None, max_length=64, json_schema_extra={"pattern": "^[0-9a-fA-F]{64}$"})
    #: S3 only: upload in this many parts (each but the last ≥ 5 MiB), one presigned PUT URL per part
    #: (schema-only bounds: the service's 400 names the limit for this size, which depends on the store)
    parts: StrictInt | None = Field(default=None, json_schema_extra={"minimum": 1, "maximum": 10_000})


class Asset(BaseModel):
    id: str
    kind: str
    status: str
    filename: str | None
    size_bytes: int | None
    content_type: str | None
    sha256: str | None
    width: int | None
    height: int | None
    duration_ms: int | None
    frame_rate: str | None
    mime_detected: str | None
    error: str | None
    created_at: str
    ready_at: str | None
    links: dict[str, str]


class UploadInstructions(BaseModel):
    method: str
    #: None for a multipart upload: PUT part n to `part_urls[n - 1]` instead
    url: str | None
    fields: dict[str, str]
    headers: dict[str, str]
    expires_at: str | None
    part_urls: list[str] | None = None


class CreatedAsset(Asset):
    upload: UploadInstructions


def render(asset: AssetView) -> dict[str, Any]:
    base = f"/v1/assets/{asset.id}"
    return Asset(
        id=str(asset.id),
        kind=asset.kind,
        status=asset.status,
        filename=asset.filename,
        size_bytes=asset.size_bytes,
        content_type=asset.content_type,
        sha256=asset.sha256,
        width=asset.width,
        height=asset.height,
        duration_ms=asset.duration_ms,
        frame_rate=asset.frame_rate,
        mime_detected=asset.mime_detected,
        error=asset.error,
        created_at=asset.created_at.isoformat(),
        ready_at=asset.ready_at.isoformat() if asset.ready_at else None,
        links={"self": base, "complete": f"{base}/complete"},
    ).model_dump()


def render_target(target: UploadTarget | PartUrls, request: Request, public_base_url: str) -> UploadInstructions:
    if isinstance(target, PartUrls):
        return UploadInstructions(
            method="PUT",
            url=None,
            fields={},
            headers={},
            part_urls=target.urls,
            expires_at=target.expires_at.isoformat(),
        )
    url = target.url
    if url.startswith("/"):  # fs store without a configured public URL: point at this API
        url = (public_base_url or str(request.base_url)).rstrip("/") + url
    return UploadInstructions(
        method=target.method,
        url=url,
        fields=target.fields,
        headers=target.headers,
        expires_at=target.expires_at.isoformat() if target.expires_at else None,
    )


@router.post("", status_code=201, response_model=CreatedAsset)
def create_asset(
    body: CreateAssetRequest, request: Request, response: Response, ctx: Ctx, principal: Auth
) -> dict[str, Any]:
    """Start an upload: returns the asset (UPLOADING) and where to send the bytes. Then call `complete`."""
    try:
        asset, target = ctx.assets.create_upload(
            principal, body.filename, body.size_bytes, body.content_type, body.sha256, body.parts
        )
    except RateLimited as exc:
        raise Problem(
            429, "rate-limited", "Too many requests", str(exc), headers={"Retry-After": str(exc.extra["retry_after"])}
        ) from None
    response.headers["Location"] = f"/v1/assets/{asset.id}"
    upload = render_target(target, request, ctx.settings.api.public_base_url)
    return {**render(asset), "upload": upload.model_dump()}


@router.post("/{asset_id}/complete", response_model=Asset)
def complete_asset(asset_id: str, ctx: Ctx, principal: Auth) -> dict[str, Any]:
    """Verify and validate the uploaded object: READY, or REJECTED with the reason in `error`; VALIDATING when
    another call is already validating it (poll `GET`). Safe to repeat."""
    return render(ctx.assets.complete(principal, asset_id))


@router.get("/{asset_id}", response_model=Asset)
def get_asset(asset_id: str, ctx: Ctx, principal: Auth) -> dict[str, Any]:
    return render(ctx.assets.get(principal, asset_id))


# --- fs store: signed upload and download ------------------------------------------------------------------


def _forbidden(exc: Exception) -> Problem:
    return Problem(403, "forbidden", "Forbidden", str(exc))


def _expires(value: str) -> int:
    if not value.isdigit() or len(value) > 12:
        raise Problem(403, "forbidden", "Forbidden", "invalid or expired signature")
    return int(value)


def _blocking_chunks(stream: AsyncIterator[bytes]) -> Iterator[bytes]:
    """The request body as a plain iterator for code running in a worker thread (the store writes files)."""

    async def next_chunk() -> bytes | None:
        try:
            return await stream.__anext__()
        except StopAsyncIteration:
            return None

    while (chunk := anyio.from_thread.run(next_chunk)) is not None:
        if chunk:
            yield chunk


@files_router.put("/v1/uploads/{upload_id}")
async def put_upload(upload_id: str, request: Request, ctx: Ctx, expires: str = "", sig: str = "") -> dict[str, Any]:
    """Upload target of the fs store: the raw body, at most the declared size, stored as sent."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        # we would either store bytes that are not what complete() should see, or decompress attacker-chosen
        # input on the server (a zip bomb); refusing is the only honest answer (U29)
        raise Problem(
            415,
            "unsupported-media-type",
            "Unsupported media type",
            "Content-Encoding is not supported on uploads: send the file's bytes as they are",
        )
    length = request.headers.get("content-length", "")
    chunks = _blocking_chunks(request.stream().__aiter__())
    try:
        stored = await run_in_threadpool(
            ctx.assets.receive_upload,
            upload_id,
            _expires(expires),
            sig[:128],
            chunks,
            int(length) if length.isdigit() else None,
        )
    except Forbidden as exc:
        raise _forbidden(exc) from None
    except PayloadTooLarge as exc:
        raise Problem(413, "payload-too-large", "Payload too large", str(exc)) from None
    return {"size_bytes": stored.size, "sha256": stored.sha256}


def _close_after(stream: IO[bytes]) -> Iterator[bytes]:
    try:
        while chunk := stream.read(CHUNK):
            yield chunk
    finally:
        stream.close()


@files_router.get("/v1/objects/{key:path}")
def get_object(key: str, ctx: Ctx, expires: str = "", sig: str = "", filename: str | None = None) -> Response:
    """Signed download from the fs store; always an attachment, never sniffed into something renderable."""
    try:
        head, stream = ctx.assets.open_signed_object(key, _expires(expires), sig[:128], filename)
    except Forbidden as exc:
        raise _forbidden(exc) from None
    headers = {
        "Content-Length": str(head.size),
        "Content-Disposition": content_disposition(filename),
        "X-Content-Type-Options": "nosniff",
        "Cache-Control": "private, no-store",
    }
    return StreamingResponse(
        _close_after(stream), media_type=head.content_type or "application/octet-stream", headers=headers
    )
