"""The `restore_logging` fixture: `configure_logging` changes process-wide state (root handlers, named loggers'
filters and levels, structlog's defaults); the fixture puts it back for the other tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """configure_logging changes process-wide state; put it back for the other tests."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    named = {
        n: (logging.getLogger(n).filters[:], logging.getLogger(n).level)
        for n in ("uvicorn", "uvicorn.error", "uvicorn.access", "httpx", "httpcore")
    }
    saved_filters = {id(h): h.filters[:] for h in root.handlers}
    yield
    for h in root.handlers[:]:
        root.removeHandler(h)
    for h in saved[0]:
        h.filters[:] = saved_filters[id(h)]
        root.addHandler(h)
    root.setLevel(saved[1])
    for n, (filters, level) in named.items():
        logging.getLogger(n).filters[:] = filters
        logging.getLogger(n).setLevel(level)
    structlog.reset_defaults()
