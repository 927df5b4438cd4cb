"""Which pytest-xdist worker this process is (`gw0`, `gw1`, …; `main` without xdist), so each worker's databases,
Redis key prefixes and RabbitMQ vhosts carry its name: two workers never share one, and a leftover says whose it
was."""

from __future__ import annotations

import os


def worker_id() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")
