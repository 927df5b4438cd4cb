"""The two servers `sse_fanout` measures, each started as its own process (`python -m bench.sse_servers MODE`):
the aivedio API (distributed mode, settings from the environment) and the bare asyncio baseline."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from bench.common import REPO

SETTINGS_ENV = "BENCH_SSE_SETTINGS"
#: set (to a file path) by --trace-memory: the system server traces allocations and, on SIGUSR1, writes the top
#: allocation sites there as JSON
TRACE_ENV = "BENCH_SSE_TRACE"


def settings_from(overrides: dict[str, Any]) -> Any:
    from aivedio_engine.config import load_settings

    config = REPO / "aivedio.toml"
    return load_settings(config if config.is_file() else None, overrides)


def serve_system(port: int) -> None:
    import uvicorn

    from aivedio_engine.api.app import create_app
    from aivedio_engine.bootstrap import build_context

    ctx = build_context(settings_from(json.loads(os.environ[SETTINGS_ENV])))
    trace_to = os.environ.get(TRACE_ENV)
    if trace_to:
        import signal
        import tracemalloc

        tracemalloc.start(1)
        base = tracemalloc.take_snapshot()

        def dump(*_: Any) -> None:
            stats = tracemalloc.take_snapshot().compare_to(base, "lineno")[:25]
            rows = [{"site": str(st.traceback[0]), "bytes": st.size_diff, "count": st.count_diff} for st in stats]
            Path(trace_to).write_text(json.dumps(rows))

        signal.signal(signal.SIGUSR1, dump)
    config = uvicorn.Config(
        create_app(ctx), host="127.0.0.1", port=port, log_level="error", access_log=False, backlog=4096
    )
    uvicorn.Server(config).run()


def serve_baseline(port: int, channel: str, redis_url: str) -> None:
    """N idle HTTP connections and one frame to each per Redis message: what any SSE server must at least do."""
    import redis.asyncio as aioredis

    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    conns: set[asyncio.StreamWriter] = set()

    def frame(v: int) -> bytes:
        body = f"id: {v}\nevent: status\ndata: {{}}\n\n".encode()
        return b"%x\r\n%s\r\n" % (len(body), body)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return  # the readiness probe: connected, sent nothing
        writer.write(head + frame(3))  # the hello the client waits for, as the system's history ends at id 3
        conns.add(writer)
        try:
            await reader.read()  # until the client closes
        finally:
            conns.discard(writer)

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        pubsub = aioredis.Redis.from_url(redis_url).pubsub()
        await pubsub.subscribe(channel)
        async with server:
            async for message in pubsub.listen():
                if message["type"] == "message":
                    data = frame(int(message["data"].split()[1]))
                    for w in list(conns):
                        w.write(data)

    asyncio.run(main())


def _serve_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.sse_servers")
    p.add_argument("mode", choices=["serve-system", "serve-baseline"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--channel", default="")
    p.add_argument("--redis-url", default="")
    a = p.parse_args(argv)
    if a.mode == "serve-system":
        serve_system(a.port)
    else:
        serve_baseline(a.port, a.channel, a.redis_url)


if __name__ == "__main__":
    _serve_main(sys.argv[1:])
