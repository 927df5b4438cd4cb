"""HMAC-signed, expiring URLs that our own API verifies (fs store objects and uploads, HLS playlists).

The signature binds method, resource, expiry and the download filename, so a URL for one object cannot be
bent to another (T8). In distributed mode every API process must share the key
(`storage.signing_key`); embedded mode keeps a generated one in the data dir.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import datetime

from aivedio_engine.clock import Clock, SystemClock


class UrlSigner:
    def __init__(self, key: bytes, clock: Clock | None = None) -> None:
        self._key = key
        self._clock = clock or SystemClock()

    def expires_in(self, ttl_s: int, now: datetime | None = None) -> int:
        return int((now or self._clock.now()).timestamp()) + int(ttl_s)

    def sign(self, method: str, resource: str, expires: int, filename: str | None = None) -> str:
        message = "\n".join((method.upper(), resource, str(expires), filename or "")).encode()
        digest = hmac.new(self._key, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def verify(
        self,
        method: str,
        resource: str,
        expires: int,
        sig: str,
        *,
        filename: str | None = None,
        now: datetime | None = None,
    ) -> bool:
        if (now or self._clock.now()).timestamp() > expires:
            return False
        return hmac.compare_digest(self.sign(method, resource, expires, filename), sig)
