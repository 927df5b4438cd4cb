"""A database connection dropped under a request is a 503, whichever layer sees it.

The create path runs its transaction as one psycopg pipeline on the raw driver connection (db/creation.py), so a
connection cut mid-request raises psycopg's own OperationalError, not SQLAlchemy's wrapper; `bench/run degrade
--row postgres` saw it answered 500 (internal-error) for the create in flight at the cut."""

from __future__ import annotations

import psycopg
from fastapi import FastAPI
from fastapi.testclient import TestClient

from aivedio_engine.api import problems


def test_raw_psycopg_operational_error_is_a_503_problem() -> None:
    app = FastAPI()
    problems.install(app)

    @app.post("/boom")
    def boom() -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    r = TestClient(app, raise_server_exceptions=False).post("/boom")
    assert r.status_code == 503
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"].endswith("database-unavailable") and r.headers["retry-after"] == "2"
