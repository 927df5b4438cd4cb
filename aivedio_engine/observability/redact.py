"""Masking secrets, signed URLs and prompts out of log output.

Two kinds of input reach a log line: structured values (a structlog event dict, where the key says what a value
is) and free text (a message a library formatted itself, such as Dramatiq's "Received message ..." with the
message's arguments, or a uvicorn access line with the request's query string, or a traceback). Keys are the
reliable signal, so structured values are masked by key first; text patterns catch the rest.

What is masked, and how it still reads:
- API keys (`avk_...`) and webhook secrets (`whsec_...`): the prefix stays, so a reader knows one was there.
- Authorization / bearer credentials, passwords in `scheme://user:password@host` URLs.
- Signed URLs: scheme, host and path stay (they say which object), the query string becomes `?<redacted>`.
- Prompts (customer content): `<redacted:N chars>`; the length helps debugging without the text.
- Configured secret values (provider API keys, webhook secrets, storage keys), wherever they appear.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

REDACTED = "<redacted>"
#: keys whose values are credentials, compared case-insensitively with `-` and `_` treated alike
SECRET_KEYS = frozenset(
    {
        "authorization",
        "proxy_authorization",
        "api_key",
        "apikey",
        "x_api_key",
        "password",
        "passwd",
        "secret",
        "secrets",
        "token",
        "access_token",
        "refresh_token",
        "webhook_secret",
        "webhook_secrets",
        "signing_key",
        "secret_access_key",
        "access_key_id",
        "sig",
        "signature",
        "x_amz_signature",
        "x_amz_credential",
        "x_amz_security_token",
        "cookie",
        "set_cookie",
    }
)
#: keys whose values are customer content
PROMPT_KEYS = frozenset({"prompt", "negative_prompt"})
#: values of these types carry no text worth masking; everything else is rendered and masked as text
_PLAIN = (bool, int, float, Decimal, UUID, datetime, date, type(None))

#: query parameters that make a URL a credential (our HMAC links, S3/GCS presigned URLs, CloudFront, API keys)
_SIGNED_PARAM = re.compile(
    r"(?:^|[&;])(?:sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|"
    r"x-goog-credential|token|access_token|key|api_key|policy|key-pair-id)=",
    re.IGNORECASE,
)
#: a URL or bare path followed by a query string; stops at whitespace, quotes and brackets
_WITH_QUERY = re.compile(r"(?P<base>[^\s?#\"'<>()\[\]{}]*)\?(?P<query>[^\s#\"'<>()\[\]{}]+)")
#: `sig=...` outside a URL (e.g. a library logging its keyword arguments)
_LOOSE_SIGNATURE = re.compile(
    r"(?P<k>\b(?:sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token)\s*=\s*)"
    r"(?P<q>['\"]?)[^&\s'\"<>,)]+(?P=q)",
    re.IGNORECASE,
)
_API_KEY = re.compile(r"\bavk_[A-Za-z0-9_\-]{4,}")
_WEBHOOK_SECRET = re.compile(r"\bwhsec_[A-Za-z0-9+/=_\-]{4,}")
_BEARER = re.compile(r"(?P<scheme>\b(?:[Bb]earer|BEARER|Basic))\s+[A-Za-z0-9._~+/=\-]{6,}")
_AUTH_HEADER = re.compile(
    r"(?P<k>\b(?:proxy-)?authorization['\"]?\s*[:=]\s*)(?P<q>['\"]?)(?P<v>[^'\"\n]+)(?P=q)", re.IGNORECASE
)
_URL_PASSWORD = re.compile(r"(?P<k>://[^:/@\s'\"]*:)[^@\s/'\"]+@")
#: `"prompt": "..."`, `'prompt': '...'`, `prompt='...'` (JSON, Python reprs, keyword arguments)
_QUOTED_PROMPT = re.compile(
    r"(?P<k>\b(?:negative_)?prompt['\"]?\s*[:=]\s*)(?P<q>['\"])(?!<redacted:)(?P<v>(?:\\.|(?!(?P=q)).)*)(?P=q)",
    re.IGNORECASE | re.DOTALL,
)
#: `prompt=...` unquoted (query strings, key=value lines): up to the next separator
_BARE_PROMPT = re.compile(r"(?P<k>\b(?:negative_)?prompt=)(?![\"']|<redacted:)(?P<v>[^&\s,;)]+)", re.IGNORECASE)


def _norm(key: str) -> str:
    return key.lower().replace("-", "_")


def prompt_mask(text: str) -> str:
    return f"<redacted:{len(text)} chars>"


class Redactor:
    """Masks one process's secrets: the patterns above plus the literal values it was given (from settings)."""

    def __init__(self, literals: Iterable[str] = ()) -> None:
        # short values would mask ordinary words; configured secrets are long in practice
        values = sorted({v for v in literals if v and len(v) >= 6}, key=len, reverse=True)
        self._literals = re.compile("|".join(re.escape(v) for v in values)) if values else None

    def text(self, text: str) -> str:
        """Free text with every known kind of secret masked."""
        if self._literals is not None:
            text = self._literals.sub(REDACTED, text)
        if "?" in text:
            text = _WITH_QUERY.sub(_mask_signed_query, text)
        if "avk_" in text:
            text = _API_KEY.sub("avk_" + REDACTED, text)
        if "whsec_" in text:
            text = _WEBHOOK_SECRET.sub("whsec_" + REDACTED, text)
        text = _AUTH_HEADER.sub(lambda m: f"{m['k']}{m['q']}{REDACTED}{m['q']}", text)
        text = _BEARER.sub(lambda m: f"{m['scheme']} {REDACTED}", text)
        text = _LOOSE_SIGNATURE.sub(lambda m: f"{m['k']}{m['q']}{REDACTED}{m['q']}", text)
        if "://" in text:
            text = _URL_PASSWORD.sub(lambda m: f"{m['k']}{REDACTED}@", text)
        if "rompt" in text or "ROMPT" in text:
            text = _QUOTED_PROMPT.sub(lambda m: f"{m['k']}{m['q']}{prompt_mask(m['v'])}{m['q']}", text)
            text = _BARE_PROMPT.sub(lambda m: f"{m['k']}{prompt_mask(m['v'])}", text)
        return text

    def value(self, value: Any, key: Any = None) -> Any:
        """A structured value with masking by key, recursing into mappings and sequences."""
        if isinstance(key, str):
            norm = _norm(key)
            if norm in PROMPT_KEYS and value is not None:
                return prompt_mask(value) if isinstance(value, str) else REDACTED
            if norm in SECRET_KEYS and value not in (None, ""):
                return REDACTED
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, _PLAIN):
            return value
        if isinstance(value, Mapping):
            return {k: self.value(v, k) for k, v in value.items()}
        if isinstance(value, (list, tuple, set, frozenset)):
            return [self.value(v) for v in value]
        if isinstance(value, (bytes, bytearray)):
            return self.text(bytes(value).decode("utf-8", "replace"))
        # an arbitrary object would be rendered by its repr, which may hold anything (a dataclass with a prompt)
        return self.text(repr(value))

    def event(self, event_dict: Mapping[str, Any]) -> dict[str, Any]:
        """A structlog event dict; keys starting with `_` are structlog's own bookkeeping and pass through."""
        return {k: v if k.startswith("_") else self.value(v, k) for k, v in event_dict.items()}


def _mask_signed_query(m: re.Match[str]) -> str:
    if _SIGNED_PARAM.search(m["query"]):
        return f"{m['base']}?{REDACTED}"
    return m.group(0)
