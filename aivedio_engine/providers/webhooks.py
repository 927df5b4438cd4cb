"""Standard Webhooks (v1, HMAC-SHA256) for provider callbacks: verify on the way in, sign in the simulator.

Why not `standardwebhooks.Webhook.verify` directly: it reads the wall clock (tests and replays need an injected
`now`), hard-codes ±5 min, accepts float timestamps, and crashes with ValueError / UnicodeDecodeError on a
`v1` header without a comma or a non-UTF-8 body — a 500 makes the vendor retry
forever. So the header grammar is checked here, strictly, and the library is used for what it is good at:
decoding `whsec_` secrets and computing the signature. Every failure becomes `CallbackRejected`.

Replays inside the tolerance window pass this check by design: `webhook-id` is returned so the event store
can dedupe; verification alone cannot know what was already applied.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import SecretStr
from standardwebhooks.webhooks import Webhook

from aivedio_engine.domain.status import CallbackRejectReason as Reason
from aivedio_engine.providers.base import CallbackRejected

DEFAULT_TOLERANCE_S = 300
#: rotation sends one signature per live secret; a handful is plenty, thousands is an attack on our CPU.
MAX_SIGNATURES = 8
MAX_SIGNATURE_HEADER_CHARS = 2048
#: the id is our dedupe key and part of the signed content: no `.` (it would make the content ambiguous).
_MSG_ID = re.compile(r"[A-Za-z0-9_\-]{1,128}")
#: integer Unix seconds only: no sign, no fraction, no exponent, no spaces; 11 digits reach year 5138.
_TIMESTAMP = re.compile(r"[0-9]{1,11}")
_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")

Secret = str | SecretStr


@dataclass(frozen=True, slots=True)
class VerifiedWebhook:
    msg_id: str
    timestamp: datetime
    body: bytes

    def json(self) -> Any:
        """The body as JSON; a signed but unparseable body is still unacceptable."""
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError):
            raise CallbackRejected("body is not valid JSON") from None


def verify_webhook(
    headers: Mapping[str, str],
    raw_body: bytes,
    secrets: Iterable[Secret],
    now: datetime,
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    max_body_bytes: int | None = None,
) -> VerifiedWebhook:
    """Check id, timestamp (±tolerance_s around `now`) and that one `v1` signature matches any of `secrets`."""
    try:
        return _verify(headers, raw_body, list(secrets), now, tolerance_s, max_body_bytes)
    except CallbackRejected:
        raise
    except Exception:  # noqa: BLE001 - the contract: a hostile request never escapes as anything but a rejection
        raise CallbackRejected("malformed webhook") from None


def _verify(
    headers: Mapping[str, str],
    raw_body: bytes,
    secrets: list[Secret],
    now: datetime,
    tolerance_s: float,
    max_body_bytes: int | None,
) -> VerifiedWebhook:
    if not isinstance(raw_body, bytes | bytearray):
        raise CallbackRejected("body must be raw bytes")
    if max_body_bytes is not None and len(raw_body) > max_body_bytes:
        raise CallbackRejected("body too large")
    values = _required_headers(headers)
    msg_id, ts_raw, sig_header = values["webhook-id"], values["webhook-timestamp"], values["webhook-signature"]
    if not _MSG_ID.fullmatch(msg_id):
        raise CallbackRejected("invalid webhook-id", Reason.SIGNATURE)
    if not _TIMESTAMP.fullmatch(ts_raw):
        raise CallbackRejected("invalid webhook-timestamp", Reason.TIMESTAMP)
    ts = int(ts_raw)
    now_s = (now if now.tzinfo else now.replace(tzinfo=UTC)).timestamp()
    if ts < now_s - tolerance_s:
        raise CallbackRejected("webhook-timestamp too old", Reason.TIMESTAMP)
    if ts > now_s + tolerance_s:
        raise CallbackRejected("webhook-timestamp too new", Reason.TIMESTAMP)
    if len(sig_header) > MAX_SIGNATURE_HEADER_CHARS:
        raise CallbackRejected("webhook-signature too long", Reason.SIGNATURE)
    candidates = _v1_signatures(sig_header)
    try:
        text = bytes(raw_body).decode("utf-8")
    except UnicodeDecodeError:
        # the library signs text; a body that is not UTF-8 cannot have come from a conforming sender
        raise CallbackRejected("body is not UTF-8") from None
    timestamp = datetime.fromtimestamp(ts, UTC)
    matched = False
    for key in _keys(secrets):
        expected = _signature_bytes(key.sign(msg_id, timestamp, text))
        # compare against every candidate, no early exit: timing says nothing about which one matched
        for candidate in candidates:
            matched |= hmac.compare_digest(expected, candidate)
    if not matched:
        raise CallbackRejected("no matching signature", Reason.SIGNATURE)
    return VerifiedWebhook(msg_id=msg_id, timestamp=timestamp, body=bytes(raw_body))


def _required_headers(headers: Mapping[str, str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower() if isinstance(name, str) else None
        if key not in _HEADERS:
            continue
        if key in found:
            # two ids or timestamps: which one was signed and which one is deduped would be up to the parser
            raise CallbackRejected(f"duplicate {key} header", Reason.SIGNATURE)
        if not isinstance(value, str):
            raise CallbackRejected(f"invalid {key} header", Reason.SIGNATURE)
        found[key] = value.strip()
    for key in _HEADERS:
        if not found.get(key):
            raise CallbackRejected(f"missing {key} header", Reason.SIGNATURE)
    return found


def _v1_signatures(header: str) -> list[bytes]:
    entries = header.split()
    if len(entries) > MAX_SIGNATURES:
        raise CallbackRejected("too many signatures", Reason.SIGNATURE)
    out: list[bytes] = []
    for entry in entries:
        version, comma, encoded = entry.partition(",")
        if not comma or version != "v1":
            continue  # unknown versions (v1a, v2) are skipped, as the spec asks; a match elsewhere still counts
        try:
            sig = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            continue
        if len(sig) == 32:
            out.append(sig)
    if not out:
        raise CallbackRejected("no v1 signature", Reason.SIGNATURE)
    return out


def _keys(secrets: list[Secret]) -> list[Webhook]:
    keys = []
    for secret in secrets:
        raw = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
        if not raw:
            continue
        try:
            keys.append(Webhook(raw))
        except Exception:  # noqa: BLE001 - a bad secret in config must not turn a callback into a 500
            continue
    if not keys:
        raise CallbackRejected("no usable webhook secret configured", Reason.NOT_CONFIGURED)
    return keys


def _signature_bytes(signed: str) -> bytes:
    return base64.b64decode(signed.partition(",")[2])


def sign_webhook(secrets: Iterable[Secret], msg_id: str, timestamp: datetime | int, raw_body: bytes) -> dict[str, str]:
    """Standard Webhooks headers for `raw_body`, one `v1` signature per secret (how senders rotate keys)."""
    ts = timestamp if isinstance(timestamp, int) else int(timestamp.timestamp())
    when = datetime.fromtimestamp(ts, UTC)
    text = raw_body.decode("utf-8")
    signatures = []
    for secret in secrets:
        raw = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
        signatures.append(Webhook(raw).sign(msg_id, when, text))
    if not signatures:
        raise ValueError("at least one secret is needed to sign")
    return {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": " ".join(signatures)}


def new_secret(seed_bytes: bytes) -> str:
    """A `whsec_` secret from raw bytes (≥ 24 bytes per the spec); tests and the sim use it."""
    if len(seed_bytes) < 24:
        raise ValueError("a webhook secret needs at least 24 bytes")
    return "whsec_" + base64.b64encode(seed_bytes).decode("ascii")
