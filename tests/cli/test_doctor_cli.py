"""`aivedio doctor`: exit 0 on a healthy set-up (embedded, and PostgreSQL + Redis + RabbitMQ), exit 1 naming the
failing check on a broken one (a database on a closed port, ffmpeg missing from PATH, roles missing while work
waits)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.media import isolation
from tests.support.app import free_port, make_context, tenant_with_key
from tests.support.rabbitmq import private_amqp_url
from tests.support.redis import REDIS_URL


def doctor(*sets: str, args: tuple[str, ...] = ("doctor", "--json")) -> tuple[int, dict[str, Any], Any]:
    argv: list[str] = []
    for s in sets:
        argv += ["--set", s]
    result = CliRunner().invoke(app, [*argv, *args])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout), result


def by_name(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in report["checks"]}


def test_healthy_embedded_set_up(tmp_path: Path) -> None:
    make_context(tmp_path / "data").close()  # the schema exists, as after a first `aivedio serve`
    code, report, _ = doctor(f"data_dir={tmp_path / 'data'}")
    checks = by_name(report)
    assert code == 0 and report["ok"] is True, report
    assert checks["ffmpeg"]["level"] == "ok" and "drawtext" in checks["ffmpeg"]["detail"]
    assert checks["ffprobe"]["level"] == "ok" and "version" in checks["ffprobe"]["detail"]
    assert checks["database"]["level"] == "ok" and "SQLite" in checks["database"]["detail"]
    assert checks["schema"]["level"] == "ok"
    assert checks["redis"]["detail"] == "not used in embedded mode"
    assert "not used in embedded mode" in checks["broker"]["detail"]
    assert checks["storage"]["level"] == "ok" and "write, read, delete" in checks["storage"]["detail"]
    assert checks["provider local"]["level"] == "ok"
    caps = isolation.capabilities()  # what this machine allows (CI: root, namespaces allowed)
    assert checks["sandbox network"]["level"] == ("ok" if caps.netns else "warn")
    assert checks["sandbox user"]["level"] == ("ok" if caps.setpriv else "warn")
    assert "61000..61031" in checks["sandbox user"]["detail"]
    # no engine runs and nothing waits: a warning, not a failure
    assert checks["role worker"]["level"] == "warn" and "nothing waits" in checks["role worker"]["detail"]
    # the probe object is gone again
    assert not list((tmp_path / "data" / "objects").rglob("doctor/*"))
    text = CliRunner().invoke(app, ["--set", f"data_dir={tmp_path / 'data'}", "doctor"])
    assert text.exit_code == 0 and "all checks ok or warnings only" in text.stdout


@pytest.fixture
def amqp_url() -> Iterator[str]:
    yield from private_amqp_url("doctor")


@pytest.mark.postgres
def test_healthy_distributed_set_up(tmp_path: Path, pg_url: str, amqp_url: str) -> None:
    code, report, _ = doctor(
        f"data_dir={tmp_path / 'data'}",
        "mode=distributed",
        f"database.url={pg_url}",
        "broker.kind=rabbitmq",
        f"broker.url={amqp_url}",
        f"redis.url={REDIS_URL}",
    )
    checks = by_name(report)
    assert code == 0, report
    assert "PostgreSQL" in checks["database"]["detail"] and checks["schema"]["level"] == "ok"
    assert checks["redis"]["level"] == "ok" and "PING" in checks["redis"]["detail"]
    assert checks["broker"]["level"] == "ok" and "RabbitMQ" in checks["broker"]["detail"]
    assert checks["clock"]["level"] == "ok" and "database" in checks["clock"]["detail"]


def test_a_database_on_a_closed_port_fails_the_database_check(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing"
    code, report, result = doctor(f"data_dir={tmp_path / 'data'}", f"database.url={url}")
    checks = by_name(report)
    assert code == 1 and report["ok"] is False
    assert checks["database"]["level"] == "fail" and "unreachable" in checks["database"]["detail"]
    assert checks["database"]["advice"]
    # the other checks still ran
    assert checks["ffmpeg"]["level"] == "ok" and checks["storage"]["level"] == "ok"
    text = CliRunner().invoke(app, ["--set", f"data_dir={tmp_path / 'data'}", "--set", f"database.url={url}", "doctor"])
    assert text.exit_code == 1 and "failed: database" in text.stdout


def test_ffmpeg_missing_from_path_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_context(tmp_path / "data").close()
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    code, report, _ = doctor(f"data_dir={tmp_path / 'data'}")
    checks = by_name(report)
    assert code == 1
    assert checks["ffmpeg"]["level"] == "fail" and checks["ffmpeg"]["detail"] == "not found on PATH"
    assert checks["ffprobe"]["level"] == "fail"
    assert {c["name"] for c in report["checks"] if c["level"] == "fail"} == {"ffmpeg", "ffprobe"}


def test_status_fails_when_work_waits_and_no_engine_runs(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "data")
    try:
        who = tenant_with_key(ctx, "t")
        ctx.generations.create(who.tenant_id, "k1", {"prompt": "a fox", "model": "local-v1", "duration_s": 2})
    finally:
        ctx.close()
    code, report, _ = doctor(f"data_dir={tmp_path / 'data'}", args=("status", "--json"))
    checks = by_name(report)
    assert code == 1 and set(checks) == {f"role {r}" for r in ("api", "relay", "worker", "scheduler", "sweeper")}
    assert checks["role relay"]["level"] == "fail" and "while 1 wait" in checks["role relay"]["detail"]
    assert checks["role api"]["level"] == "warn"
    assert report["liveness"]["backlog"]["queued_tasks"] == 1


@pytest.fixture
def vendor_url() -> Iterator[str]:
    """A real loopback HTTP server standing in for a vendor's API: it answers 401 to everything."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_providers_credentials_and_reachability(tmp_path: Path, vendor_url: str) -> None:
    make_context(tmp_path / "data").close()
    config = tmp_path / "aivedio.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        f'[providers.local]\nadapter = "local"\n'
        f'[providers.runway]\nadapter = "runway"\nbase_url = "{vendor_url}"\napi_key = "k"\n'
        f'[providers.fal]\nadapter = "fal"\nbase_url = "{vendor_url}"\n'
        f'[providers.kling]\nadapter = "kling"\nbase_url = "http://127.0.0.1:{free_port()}"\napi_key = "k"\n'
        f"supports_lookup_by_request_key = false\n"
    )
    result = CliRunner().invoke(app, ["--config", str(config), "doctor", "--json"])
    report = json.loads(result.stdout)
    checks = by_name(report)
    assert result.exit_code == 1
    assert checks["provider runway"]["level"] == "ok" and "answered HTTP 401" in checks["provider runway"]["detail"]
    assert "lookup by request key" in checks["provider runway"]["detail"]
    assert checks["provider fal"]["level"] == "fail" and "no API key" in checks["provider fal"]["detail"]
    assert checks["provider fal"]["advice"] == "set AIVEDIO_PROVIDERS__FAL__API_KEY"
    assert checks["provider kling"]["level"] == "fail" and "unreachable" in checks["provider kling"]["detail"]
    assert "no lookup by request key" not in checks["provider runway"]["detail"]
    assert {c["name"] for c in report["checks"] if c["level"] == "fail"} == {"provider fal", "provider kling"}


@pytest.mark.postgres
def test_an_unmigrated_database_fails_the_schema_check(tmp_path: Path, pg_empty_url: str) -> None:
    code, report, _ = doctor(f"data_dir={tmp_path / 'data'}", f"database.url={pg_empty_url}")
    checks = by_name(report)
    assert code == 1 and checks["database"]["level"] == "ok"
    assert checks["schema"]["level"] == "fail" and checks["schema"]["advice"] == "run `aivedio db upgrade`"
    assert " pending: 0001_tenants_keys.sql, 0002_" in checks["schema"]["detail"]
    assert checks["roles"]["level"] == "fail" and "aivedio db upgrade" in checks["roles"]["advice"]


def test_a_sandbox_switched_off_is_a_warning_with_advice(tmp_path: Path) -> None:
    make_context(tmp_path / "data").close()
    off = ("media.sandbox.network_isolation=false", "media.sandbox.user_isolation=false")
    code, report, _ = doctor(f"data_dir={tmp_path / 'data'}", *off)
    checks = by_name(report)
    assert code == 0 and checks["sandbox network"]["level"] == checks["sandbox user"]["level"] == "warn"
    assert "network_isolation = false" in checks["sandbox network"]["detail"] and checks["sandbox user"]["advice"]
