"""Signed playback without an API key: `GET /v1/playback/{asset}/index.m3u8` (an HLS playlist whose segments
carry their own signed URLs) and `GET /v1/generations/{id}/player` (a minimal page for a reviewer on another
machine: an HTML5 video of the proxy MP4, its HLS rendition first for browsers that play HLS themselves).

Like `/v1/objects/`, the signature in the query string is the credential (players cannot send headers), so a
wrong or expired one is a 403.
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from datetime import UTC, datetime
from html import escape

from fastapi import APIRouter, Response
from fastapi.responses import HTMLResponse

from aivedio_engine.api.deps import Ctx
from aivedio_engine.api.problems import Problem
from aivedio_engine.services.errors import Forbidden, NotFound
from aivedio_engine.services.player import PlayerPage

router = APIRouter(tags=["playback"])

#: shows the duration once the browser read the metadata: the reviewer sees it, and a headless check reads it
_SCRIPT = (
    "const v=document.getElementById('player'),d=document.getElementById('duration');"
    "v.addEventListener('loadedmetadata',()=>{d.textContent=v.duration.toFixed(3);d.dataset.state='ok'});"
    "v.addEventListener('error',()=>{d.dataset.state='error'},true);"
)
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
#: media may come from the object store's own host (s3 presigned URLs); nothing else is loaded or run
_CSP = (
    f"default-src 'none'; media-src 'self' https: http:; img-src 'self' https: http:; "
    f"style-src 'unsafe-inline'; script-src 'sha256-{_SCRIPT_HASH}'; base-uri 'none'; form-action 'none'"
)
_HEADERS = {
    "Cache-Control": "private, no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the page's URL is a credential
}


@router.get("/v1/playback/{asset_id}/index.m3u8")
def hls_playlist(asset_id: str, ctx: Ctx, expires: str = "", sig: str = "") -> Response:
    if not expires.isdigit() or len(expires) > 12:
        raise Problem(403, "forbidden", "Forbidden", "invalid or expired playback signature")
    try:
        text = ctx.outputs.signed_playlist(asset_id, int(expires), sig[:128])
    except Forbidden as exc:
        raise Problem(403, "forbidden", "Forbidden", str(exc)) from None
    return Response(text, media_type="application/vnd.apple.mpegurl", headers=_HEADERS)


@router.get("/v1/generations/{task_id}/player", response_class=HTMLResponse)
def player(task_id: uuid.UUID, ctx: Ctx, expires: str = "", sig: str = "") -> HTMLResponse:
    """A page that plays the generation's proxy MP4 (HLS where the browser plays it); signed, no API key."""
    if not expires.isdigit() or len(expires) > 12:
        raise Problem(403, "forbidden", "Forbidden", "invalid or expired player signature")
    try:
        page = ctx.player.page(task_id, int(expires), sig[:128])
    except Forbidden as exc:
        raise Problem(403, "forbidden", "Forbidden", str(exc)) from None
    except NotFound as exc:
        raise Problem(404, "not-found", "Not Found", str(exc)) from None
    return HTMLResponse(render_page(page), headers={**_HEADERS, "Content-Security-Policy": _CSP})


def render_page(p: PlayerPage) -> str:
    size = f"{p.width}x{p.height} · " if p.width and p.height else ""
    until = datetime.fromtimestamp(p.expires, UTC).strftime("%Y-%m-%d %H:%M UTC")
    poster = f' poster="{escape(p.poster)}"' if p.poster else ""
    hls = f'<source src="{escape(p.hls)}" type="application/vnd.apple.mpegurl">' if p.hls else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<title>aivedio · generation {p.task_id}</title>
<style>body{{margin:0;background:#111;color:#ccc;font:14px system-ui,sans-serif}}
video{{display:block;width:100%;max-height:88vh;background:#000}}p{{margin:8px 12px}}</style></head>
<body><video id="player" controls playsinline preload="metadata"{poster}>{hls}
<source src="{escape(p.mp4)}" type="video/mp4"></video>
<p>generation {p.task_id} · {size}duration <span id="duration" data-state="loading">…</span> s
· link valid until {until}</p>
<script>{_SCRIPT}</script></body></html>
"""
