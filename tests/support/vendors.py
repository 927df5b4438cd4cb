"""What the vendor adapters' contract tests share: the recorded responses (`tests/contract/fixtures/<vendor>/`, each
naming its source), a MockTransport router over them, provider settings, and each vendor's way of signing a
callback."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import SecretStr

from aivedio_engine.config import ModelSettings, ProviderSettings
from aivedio_engine.providers.webhooks import new_secret, sign_webhook

FIXTURES = Path(__file__).resolve().parents[1] / "contract" / "fixtures"
NOW = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
CREATED = datetime(2026, 7, 1, 11, 58, tzinfo=UTC)
KEY = "req_01J9ZK4Q2V7W8X9Y0A1B2C3D4E"
RUNWAY_SECRET = "relay-shared-secret-0123456789"
REPLICATE_SECRET = new_secret(b"replicate-test-secret-32-bytes!!")
KLING_SECRET = "kling-callback-secret-0123456789"
FAL_KEY = Ed25519PrivateKey.generate()
FAL_PUBLIC = base64.b64encode(FAL_KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


class FixedClock:
    def now(self) -> datetime:
        return NOW


def fixture(vendor: str, name: str) -> dict[str, Any]:
    data = json.loads((FIXTURES / vendor / f"{name}.json").read_text())
    assert data["_source"], f"{vendor}/{name} must name its source"
    return data


def reply(fx: dict[str, Any], status: int | None = None) -> httpx.Response:
    body = fx.get("body")
    content = b"" if body is None else json.dumps(body).encode()
    return httpx.Response(status or fx["status"], headers=fx.get("headers", {}), content=content)


class Router:
    """A MockTransport handler: (method, path) → fixture name, httpx.Response, exception, or callable."""

    def __init__(self, vendor: str, routes: dict[tuple[str, str], Any]) -> None:
        self.vendor, self.routes, self.calls = vendor, routes, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request)
        key = (request.method, request.url.path)
        assert key in self.routes, f"unexpected call {key}"
        action = self.routes[key]
        if isinstance(action, Exception):
            raise action
        if isinstance(action, str):
            return reply(fixture(self.vendor, action))
        return action(request) if callable(action) else action


def settings(adapter: str, model: str, api_key: str, secrets: list[str], **extra: Any) -> ProviderSettings:
    price = {"720p": Decimal("1"), "1080p": Decimal("2")}
    return ProviderSettings(
        adapter=adapter,
        base_url=f"https://{adapter}.test",
        api_key=SecretStr(api_key),
        webhook_secrets=[SecretStr(s) for s in secrets],
        models={model: ModelSettings(max_duration_s=10, resolutions=["720p", "1080p"], price_per_second=price)},
        **extra,
    )


# --- callback signing, per vendor ---------------------------------------------------------------------------------


def sign_runway(body: bytes, when: datetime = NOW, secret: str = RUNWAY_SECRET) -> dict[str, str]:
    return {"X-Aivedio-Callback-Token": secret}


def sign_replicate(body: bytes, when: datetime = NOW, secret: str = REPLICATE_SECRET) -> dict[str, str]:
    return sign_webhook([secret], "msg_2Zf9Xq7LwR", when, body)


def sign_fal(body: bytes, when: datetime = NOW, key: Ed25519PrivateKey = FAL_KEY) -> dict[str, str]:
    request_id = json.loads(body)["request_id"] if body.startswith(b"{") else "024ca5b1-45d3-4afd-883e-ad3abe2a1c4d"
    ts = str(int(when.timestamp()))
    message = f"{request_id}\nuser-123\n{ts}\n{hashlib.sha256(body).hexdigest()}".encode()
    return {
        "X-Fal-Webhook-Request-Id": request_id,
        "X-Fal-Webhook-User-Id": "user-123",
        "X-Fal-Webhook-Timestamp": ts,
        "X-Fal-Webhook-Signature": key.sign(message).hex(),
    }


def sign_kling(body: bytes, when: datetime = NOW, secret: str = KLING_SECRET) -> dict[str, str]:
    key = json.loads(body)["task_info"]["external_task_id"]
    return {"X-Aivedio-Callback-Token": hmac.new(secret.encode(), key.encode(), hashlib.sha256).hexdigest()}
