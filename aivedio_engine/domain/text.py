"""Text a database can store: PostgreSQL refuses NUL in text and JSONB, and a lone surrogate is not UTF-8."""

from __future__ import annotations

import re

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def is_storable(value: str) -> bool:
    return _UNSTORABLE.search(value) is None
