"""The reviewer's playback page (`GET /v1/generations/{id}/player`): a signed link to one generation's proxy MP4
(and its HLS rendition, for browsers that play HLS themselves) that works on another machine without an API key.

Like `/v1/playback/`, the HMAC signature in the query string is the credential: it binds the page's path and its
expiry (`storage.playback_url_ttl_s`), and the media URLs inside the page are signed for the same lifetime. The
operator tools (`o` on the TUI's review screen) mint the link; the API serves the page.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from urllib.parse import urlencode

from aivedio_engine.config import Settings
from aivedio_engine.db import tasks
from aivedio_engine.db.handles import Engine
from aivedio_engine.db.session import read_conn
from aivedio_engine.domain.status import DerivativeProfile
from aivedio_engine.services.errors import Forbidden, NotFound
from aivedio_engine.services.outputs import OutputService
from aivedio_engine.storage.signing import UrlSigner

PLAYER_PATH = "/v1/generations/{task_id}/player"


@dataclass(frozen=True)
class PlayerPage:
    task_id: uuid.UUID
    #: signed URLs (paths starting with / are on this API)
    mp4: str
    hls: str | None
    poster: str | None
    width: int | None
    height: int | None
    expires: int


class PlayerService:
    def __init__(self, engine: Engine, settings: Settings, outputs: OutputService, signer: UrlSigner) -> None:
        self._engine = engine
        self._settings = settings
        self._outputs = outputs
        self._signer = signer

    def base_url(self) -> str:
        api = self._settings.api
        return (api.public_base_url or f"http://{api.host}:{api.port}").rstrip("/")

    def link(self, task_id: uuid.UUID) -> str:
        """An absolute, signed link to the task's playback page; NotFound while it has no READY proxy MP4."""
        tenant_id = self._tenant(task_id)
        if DerivativeProfile.PROXY_MP4.value not in self._outputs.files(tenant_id, task_id):
            raise NotFound(f"task {task_id} has no READY proxy MP4 to play (yet)")
        expires = self._signer.expires_in(self._settings.storage.playback_url_ttl_s)
        path = PLAYER_PATH.format(task_id=task_id)
        sig = self._signer.sign("GET", path, expires)
        return f"{self.base_url()}{path}?{urlencode({'expires': expires, 'sig': sig})}"

    def page(self, task_id: uuid.UUID, expires: int, sig: str) -> PlayerPage:
        if not self._signer.verify("GET", PLAYER_PATH.format(task_id=task_id), expires, sig):
            raise Forbidden("invalid or expired player signature")
        tenant_id = self._tenant(task_id)
        files = self._outputs.files(tenant_id, task_id)
        proxy = files.get(DerivativeProfile.PROXY_MP4.value)
        if proxy is None:
            raise NotFound("no playable output")
        urls = self._outputs.urls(tenant_id, task_id, files)
        return PlayerPage(
            task_id=task_id,
            mp4=urls[DerivativeProfile.PROXY_MP4.value],
            hls=urls.get(DerivativeProfile.HLS.value),
            poster=urls.get(DerivativeProfile.THUMBNAIL.value),
            width=proxy.width,
            height=proxy.height,
            expires=expires,
        )

    def _tenant(self, task_id: uuid.UUID) -> uuid.UUID:
        with read_conn(self._engine) as conn:
            row = tasks.read(conn, task_id)
        if row is None:
            raise NotFound(f"task {task_id} not found")
        return uuid.UUID(str(row.tenant_id))
