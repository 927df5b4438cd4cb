"""Time and identity sources, injected everywhere so tests control them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Protocol

from uuid_utils.compat import uuid7


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


def new_id() -> uuid.UUID:
    """UUIDv7: time-ordered, so primary-key inserts stay at the right edge of the index."""
    return uuid7()
