"""Private RabbitMQ virtual hosts for tests and benchmarks: one vhost isolates one run, as a key prefix does in Redis.

RabbitMQ has no key prefix: queues are named after the actors' queues, so two runs on one server would share
them. A vhost per run keeps them apart and is removed, with every queue in it, when the run ends. Managed with
`rabbitmqctl` (the server is local and we are its administrator here); about a second per call.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

#: the server's address; `guest` may only log in over loopback, which is where tests run
AMQP_HOST = os.environ.get("AIVEDIO_TEST_AMQP_HOST", "127.0.0.1:5672")
AMQP_USER = "guest"


class RabbitmqUnavailable(RuntimeError):
    """rabbitmqctl is missing or the server does not answer."""


def _ctl(*args: str) -> None:
    exe = shutil.which("rabbitmqctl")
    if exe is None:
        raise RabbitmqUnavailable("rabbitmqctl not found (install rabbitmq-server; scripts/test starts it)")
    done = subprocess.run([exe, "-q", *args], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RabbitmqUnavailable(f"rabbitmqctl {' '.join(args)}: {(done.stderr or done.stdout).strip()[:300]}")


@contextmanager
def private_vhost(label: str) -> Iterator[str]:
    """Create `aivedio-<label>-<random>`, yield its amqp:// URL, delete it (and its queues) afterwards."""
    name = f"aivedio-{label}-{uuid.uuid4().hex[:10]}"
    _ctl("add_vhost", name)
    try:
        _ctl("set_permissions", "-p", name, AMQP_USER, ".*", ".*", ".*")
        yield f"amqp://{AMQP_USER}:{AMQP_USER}@{AMQP_HOST}/{quote(name, safe='')}"
    finally:
        _ctl("delete_vhost", name)
