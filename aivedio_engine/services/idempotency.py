"""The Idempotency-Key as every front end hands it in (a header's raw bytes, a decoded header, a query value, an
in-process caller's string), turned into the key by the one rule (`domain.idempotency`) or refused as a 400."""

from __future__ import annotations

from aivedio_engine.domain.idempotency import KeyMissing, KeyRejected, idempotency_key
from aivedio_engine.services.errors import InvalidIdempotencyKey, MissingIdempotencyKey


def checked_key(raw: str | bytes | None) -> str:
    try:
        return idempotency_key(raw)
    except KeyMissing as exc:
        raise MissingIdempotencyKey(str(exc)) from None
    except KeyRejected as exc:
        raise InvalidIdempotencyKey(str(exc)) from None
