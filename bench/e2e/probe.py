"""`python -m bench.e2e.probe HOPS_FILE <aivedio arguments>`: run `aivedio` (the worker role) with one Dramatiq
middleware added to the product's broker, which appends a line per message an actor is about to process:

    message id <TAB> actor <TAB> message timestamp (ms, set when the relay built the message) <TAB> start (ms)

The relay uses the outbox row's id as the message id, so the benchmark joins these lines to `outbox_events`
(created_at: the enqueue; published_at: the relay's publish) for the hop figures. Measurement only: the product
runs unchanged otherwise (the broker is built by `worker.broker.setup_broker`, wrapped here)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import dramatiq
from dramatiq.middleware import Middleware


class HopRecorder(Middleware):
    def __init__(self, path: str) -> None:
        # line-buffered: every line is in the file once the message is being processed
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        self._lock = threading.Lock()

    def before_process_message(self, broker: dramatiq.Broker, message: dramatiq.Message[Any]) -> None:
        line = f"{message.message_id}\t{message.actor_name}\t{message.message_timestamp}\t{time.time() * 1000:.3f}\n"
        with self._lock:
            self._file.write(line)


def main() -> None:
    path, args = sys.argv[1], sys.argv[2:]
    from aivedio_engine.worker import broker as broker_module
    from aivedio_engine.worker import runtime

    build = broker_module.setup_broker

    def setup_broker(settings: Any, ctx: Any = None) -> dramatiq.Broker:
        broker = build(settings, ctx)
        broker.add_middleware(HopRecorder(path))
        return broker

    runtime.setup_broker = setup_broker  # type: ignore[assignment] # the name runtime calls
    from aivedio_cli.main import run

    sys.argv = ["aivedio", *args]
    run()


if __name__ == "__main__":
    main()
