"""ASGI factory for the benchmark's API processes.

    BENCH_API_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/DB \\
        .venv/bin/uvicorn --factory bench.api_server:app --workers 2 --port 8765

Every worker process builds its own AppContext (its own connection pool) from the same settings the benchmark
used to migrate the database and create the tenant: distributed mode, PostgreSQL, default durability.
"""

from __future__ import annotations

import os
from typing import Any

from aivedio_engine.config import Settings, load_settings

DATABASE_URL_ENV = "BENCH_API_DATABASE_URL"
POOL_SIZE_ENV = "BENCH_API_POOL_SIZE"
DATA_DIR_ENV = "BENCH_API_DATA_DIR"


def bench_settings(database_url: str, pool_size: int = 20, data_dir: str | None = None) -> Settings:
    from bench.common import REPO

    overrides: dict[str, Any] = {
        "mode": "distributed",
        "database": {"url": database_url, "pool_size": pool_size},
        "broker": {"kind": "redis"},
        # the benchmark measures the create path, not a tenant's request rate limit
        "api": {"tenant_rate_limit_per_s": 1e9, "tenant_rate_burst": 10**9},
        # nor load shedding: nothing relays the outbox here, so after limits.shed_outbox_age_s (300 s) of a full
        # run every create was refused 503 (reps 2 and 3 of a full run measured 0 creates/s)
        "limits": {"shed_outbox_age_s": 0},
    }
    if data_dir:
        overrides["data_dir"] = data_dir
    config = REPO / "aivedio.toml"
    return load_settings(config if config.is_file() else None, overrides)


def app() -> Any:
    from aivedio_engine.api.app import create_app
    from aivedio_engine.bootstrap import build_context

    settings = bench_settings(
        os.environ[DATABASE_URL_ENV], int(os.environ.get(POOL_SIZE_ENV, "20")), os.environ.get(DATA_DIR_ENV) or None
    )
    return create_app(build_context(settings))


def main(argv: list[str] | None = None) -> None:
    """`python -m bench.api_server --port P --workers N`: uvicorn's own multi-process supervisor, but with a
    listening socket created with proto=IPPROTO_TCP.

    `uvicorn --workers N` binds its listener with proto 0; accepted sockets inherit it and asyncio then skips
    TCP_NODELAY, so every keep-alive response after the first waits ~40 ms for the client's delayed ACK
    (Kludex/uvicorn#3149; measured here: GET /healthz p50 44 ms with --workers 2, 1.8 ms with --workers 1).
    A benchmark of the API must not measure that, so the bench binds the socket itself.
    """
    import argparse
    import socket

    from uvicorn import Config, Server
    from uvicorn.supervisors import Multiprocess

    p = argparse.ArgumentParser(prog="python -m bench.api_server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    config = Config(
        "bench.api_server:app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level="warning",
        access_log=False,
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.set_inheritable(True)
    if args.workers > 1:
        Multiprocess(config, sockets=[sock]).run()
    else:
        Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
