"""The shared RabbitMQ server for tests: a private virtual host per test, deleted (with its queues) after."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from aivedio_engine.testing.rabbitmq import RabbitmqUnavailable, private_vhost
from tests.support.workers import worker_id


def private_amqp_url(label: str) -> Iterator[str]:
    """Yield the amqp:// URL of a fresh vhost named after this worker and `label`; skip when RabbitMQ is unavailable
    (fail under CI=true)."""
    try:
        ctx = private_vhost(f"{worker_id()}-{label}")
        url = ctx.__enter__()
    except RabbitmqUnavailable as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(str(exc))
    try:
        yield url
    finally:
        ctx.__exit__(None, None, None)
