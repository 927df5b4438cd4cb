"""`GET /v1/playback/{asset}/index.m3u8`: an HLS playlist whose segments carry their own signed URLs.

No API key: like `/v1/objects/`, the signature in the query string is the credential (players cannot send
headers), so a wrong or expired one is a 403.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from aivedio_engine.api.deps import Ctx
from aivedio_engine.api.problems import Problem
from aivedio_engine.services.errors import Forbidden

router = APIRouter(tags=["playback"])


@router.get("/v1/playback/{asset_id}/index.m3u8")
def hls_playlist(asset_id: str, ctx: Ctx, expires: str = "", sig: str = "") -> Response:
    if not expires.isdigit() or len(expires) > 12:
        raise Problem(403, "forbidden", "Forbidden", "invalid or expired playback signature")
    try:
        text = ctx.outputs.signed_playlist(asset_id, int(expires), sig[:128])
    except Forbidden as exc:
        raise Problem(403, "forbidden", "Forbidden", str(exc)) from None
    return Response(
        text,
        media_type="application/vnd.apple.mpegurl",
        headers={"Cache-Control": "private, no-store", "X-Content-Type-Options": "nosniff"},
    )
