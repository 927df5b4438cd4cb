"""The Idempotency-Key rule, pure: what a client's key is, from the header value (or query value) it sent.

HTTP lets any hop add or drop optional whitespace around a field value (RFC 9110 §5.5: leading and trailing SP
and HTAB are not part of it), and the parsers disagree on it: h11 strips both ends, httptools only the leading
one. So the key is the value with that whitespace removed, here, whatever parsed it — `k`, `k ` and `k\\t` are
one key — and then it must match `KEY_PATTERN`: printable ASCII, spaces only inside. Anything else is refused
with the reason rather than stored: bytes outside ASCII have no agreed decoding (the same `café` arrives as UTF-8
from one client and Latin-1 from another), and a key that another decoding could turn into a different string
cannot identify one request.

Bytes (a raw header) and text (an in-process caller, or a header value Starlette decoded as Latin-1, which maps
each byte to the code point of the same value) are judged alike: one character per byte.
"""

from __future__ import annotations

KEY_MAX = 255
#: what a key is once the optional whitespace around it is removed (also what the OpenAPI schema states)
KEY_PATTERN = r"^[!-~]([ -~]*[!-~])?$"
#: RFC 9110 OWS: space and horizontal tab
_OWS = " \t"


class KeyRejected(ValueError):
    """The value is not a key; the message says why, for the 400."""


class KeyMissing(KeyRejected):
    """No key at all, or only whitespace."""


def idempotency_key(raw: str | bytes | None) -> str:
    """The key `raw` stands for, or `KeyRejected` saying why it is none."""
    if raw is None:
        raise KeyMissing("the Idempotency-Key header is required")
    text = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    key = text.strip(_OWS)
    if not key:
        raise KeyMissing("the Idempotency-Key header is required (it held only whitespace)")
    if len(key) > KEY_MAX:
        raise KeyRejected(f"Idempotency-Key is {len(key)} characters long; at most {KEY_MAX} are allowed")
    if key.isascii() and key.isprintable():  # the common case, without a loop in Python
        return key
    for i, ch in enumerate(key):
        code = ord(ch)
        if code < 0x20 or code == 0x7F:
            raise KeyRejected(
                f"Idempotency-Key must be printable ASCII: character {i + 1} is the control character 0x{code:02X}"
            )
        if code > 0x7F:
            # a header decoded as Latin-1 names the byte that came, as the raw bytes would
            what = f"0x{code:02X}" if code <= 0xFF else f"U+{code:04X}"
            raise KeyRejected(
                f"Idempotency-Key must be printable ASCII: character {i + 1} ({what}) is not ASCII "
                "(no encoding of non-ASCII keys is agreed on: percent- or base64-encode them)"
            )
    raise AssertionError(f"unreachable: {key!r} is printable ASCII")
