"""The request fingerprint: what a generation request looks like from the vendor's side, hashed.

The attempt row stores it when the attempt is created (`db.attempts.fingerprint`), and an adapter that can list
a vendor's recent jobs computes it from what the vendor echoes of each job's request; reconciliation of an
ambiguous submit matches the two. Both sides must therefore hash the same fields normalised the same way, which
is why this is the one function that does it. Only fields every vendor echoes are included: our own fields
(priority, deadline, provider) never reach the vendor, and reference images reach it as short-lived URLs that
differ per send, so they cannot be matched on.

Pure: stdlib only, no I/O.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Mapping
from typing import Any

FIELDS = ("prompt", "model", "duration_s", "resolution", "aspect_ratio", "seed")
#: every request has these; only the seed is optional
REQUIRED = FIELDS[:-1]


def request_fingerprint(fields: Mapping[str, Any]) -> bytes:
    """sha256 over the canonical JSON of FIELDS taken from `fields` (other keys are ignored, a missing one is null).

    Values are normalised so that a vendor's harmless re-spelling of what we sent still matches: the prompt in
    Unicode NFC without surrounding blanks (as `domain.requests.normalize` stores it), whole-number floats
    (`5.0`) as integers. Anything else is hashed as given, so a real difference stays a difference.
    """
    canonical = {name: _normal(name, fields.get(name)) for name in FIELDS}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).digest()


def _normal(name: str, value: Any) -> Any:
    if name == "prompt" and isinstance(value, str):
        return unicodedata.normalize("NFC", value.strip())
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def echoed_fingerprint(echo: Any) -> bytes | None:
    """The fingerprint of a request as a vendor echoes it, or None when the echo lacks a field every request
    has: then it is not known whose job it is, and the caller must not read it as "not ours"."""
    if not isinstance(echo, Mapping) or any(echo.get(name) is None for name in REQUIRED):
        return None
    return request_fingerprint(echo)
