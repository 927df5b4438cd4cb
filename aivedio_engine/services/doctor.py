"""`aivedio doctor`: is this set-up able to run the engine? One check per dependency, each ok / warn / fail with one
line of advice.

Every check runs on its own and catches its own failure, so one broken dependency never hides the others. No check
changes anything an operator cares about: the storage probe writes, reads and deletes one small object under
`doctor/`, and nothing else is written. Embedded mode (SQLite, fs store, in-process broker) skips what it does
not use and says so.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aivedio_engine.clock import new_id

if TYPE_CHECKING:
    from aivedio_engine.clock import Clock
    from aivedio_engine.config import Settings
    from aivedio_engine.db.handles import Engine
    from aivedio_engine.services.liveness import LivenessReport, LivenessService
    from aivedio_engine.storage.base import ObjectStore

#: the ffmpeg filters the media pipeline and the local provider use (media/ffgraph.py)
FILTERS = (
    "scale",
    "format",
    "crop",
    "setsar",
    "fade",
    "afade",
    "trim",
    "volume",
    "zoompan",
    "showwavespic",
    "drawtext",
)
#: clock skew against the database above which ages, deadlines and signed URLs go wrong
SKEW_WARN_S, SKEW_FAIL_S = 2.0, 30.0
_TIMEOUT_S = 5.0
NOT_EMBEDDED = "not used in embedded mode"


class Level(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    name: str
    level: Level
    detail: str
    advice: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "level": self.level.value, "detail": self.detail, "advice": self.advice}


@dataclass(frozen=True)
class DoctorReport:
    checks: list[Check]
    liveness: LivenessReport | None = None

    @property
    def ok(self) -> bool:
        return all(c.level is not Level.FAIL for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.level is Level.FAIL]

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checks": [c.to_dict() for c in self.checks],
            "liveness": self.liveness.to_dict() if self.liveness else None,
        }


@dataclass
class Doctor:
    settings: Settings
    clock: Clock
    #: built lazily: a broken database URL must not stop the other checks
    engine: Callable[[], Engine]
    storage: Callable[[], ObjectStore]
    liveness: Callable[[], LivenessService]
    _report: LivenessReport | None = field(default=None, init=False)
    #: set by the database check: the checks that need the database then say so once instead of failing again
    _db_down: bool = field(default=False, init=False)

    def run(self) -> DoctorReport:
        checks: list[Check] = []
        for step in (
            self._ffmpeg,
            self._sandbox,
            self._fonts,
            self._database,
            self._redis,
            self._broker,
            self._storage,
            self._providers,
            self._clock,
            self._roles,
        ):
            checks += self._guard(step)
        return DoctorReport(checks, self._report)

    def roles(self) -> DoctorReport:
        """The roles section alone (`aivedio status`)."""
        self._sqlite_missing()
        return DoctorReport(self._guard(self._roles), self._report)

    def _sqlite_missing(self) -> bool:
        """Embedded mode before its first run: no file yet (and connecting would create an empty one)."""
        engine = self.engine()
        if engine.dialect.name == "sqlite" and engine.url.database and not Path(engine.url.database).exists():
            self._db_down = True
        return self._db_down

    def _guard(self, step: Callable[[], list[Check]]) -> list[Check]:
        try:
            return step()
        except Exception as exc:  # noqa: BLE001 - a check that breaks is a failed check, never a crash
            name = step.__name__.lstrip("_")
            return [Check(name, Level.FAIL, f"check failed: {_first_line(exc)}", "see the error above")]

    # --- media ---------------------------------------------------------------------------------------------

    def _ffmpeg(self) -> list[Check]:
        out = []
        for tool in ("ffmpeg", "ffprobe"):
            path = shutil.which(tool)
            if path is None:
                out.append(Check(tool, Level.FAIL, "not found on PATH", "install ffmpeg (apt install ffmpeg)"))
                continue
            version = _run([path, "-hide_banner", "-version"]).split("\n", 1)[0]
            found = re.search(r"version (\S+)", version)
            detail = f"{path}, version {found.group(1) if found else 'unknown'}"
            if tool == "ffmpeg":
                listed = _run([path, "-hide_banner", "-filters"])
                names = {m.group(1) for m in re.finditer(r"^\s*[.TSCA|]+\s+(\w+)\s", listed, re.MULTILINE)}
                missing = [f for f in FILTERS if f not in names]
                if missing:
                    out.append(
                        Check(
                            tool,
                            Level.FAIL if set(missing) - {"drawtext"} else Level.WARN,
                            f"{detail}; missing filters: {', '.join(missing)}",
                            "install a full ffmpeg build (Debian's ffmpeg package has them all)",
                        )
                    )
                    continue
                detail += f"; filters {', '.join(FILTERS)} present"
            out.append(Check(tool, Level.OK, detail))
        return out

    def _sandbox(self) -> list[Check]:
        from aivedio_engine.media import isolation

        return [
            Check(f"sandbox {aspect}", Level.OK if ok else Level.WARN, detail, "" if ok else advice)
            for aspect, ok, detail, advice in isolation.report(isolation.policy_from(self.settings.media.sandbox))
        ]

    def _fonts(self) -> list[Check]:
        from aivedio_engine.media import render

        if not any(p.enabled and p.adapter == "local" for p in self.settings.providers.values()):
            return [Check("fonts", Level.OK, "no local provider enabled: captions are not drawn here")]
        font = render.pick_font()
        fc = shutil.which("fc-match")
        matched = _run([fc, "-f", "%{file}", "sans"]).strip() if fc else ""
        if font is None:
            hint = f" (fontconfig finds {matched}, but not at a path the local provider reads)" if matched else ""
            return [
                Check(
                    "fonts",
                    Level.WARN,
                    f"no caption font found{hint}: the local provider skips captions",
                    "install fonts-dejavu-core",
                )
            ]
        via = f"; fontconfig: {matched}" if matched else "; fontconfig (fc-match) not installed"
        return [Check("fonts", Level.OK, f"captions use {font}{via}")]

    # --- database ------------------------------------------------------------------------------------------

    def _database(self) -> list[Check]:
        from aivedio_engine.db import migrate, server
        from aivedio_engine.db.handles import SQLAlchemyError

        engine = self.engine()
        url = engine.url.render_as_string(hide_password=True)
        if self._sqlite_missing():
            return [
                Check(
                    "database",
                    Level.WARN,
                    f"{url}: no database yet",
                    "created by the first `aivedio serve` or `aivedio generate` (or `aivedio db upgrade`)",
                )
            ]
        started = time.monotonic()
        try:
            with engine.connect() as conn:
                server.ping(conn)
                latency_ms = (time.monotonic() - started) * 1000
                name, version = server.product_version(conn)
        except SQLAlchemyError as exc:
            self._db_down = True
            return [
                Check(
                    "database",
                    Level.FAIL,
                    f"{url}: unreachable: {_first_line(getattr(exc, 'orig', None) or exc)}",
                    "check database.url and that the server is running",
                )
            ]
        out = [Check("database", Level.OK, f"{url}: {name} {version}, {latency_ms:.0f} ms")]
        states = migrate.status(engine)
        bad = [s.name for s in states if s.state in (migrate.CHECKSUM_MISMATCH, migrate.MISSING_FILE)]
        pending = [s.name for s in states if s.state == migrate.PENDING]
        applied = [s.name for s in states if s.state == migrate.APPLIED]
        if bad:
            out.append(
                Check(
                    "schema",
                    Level.FAIL,
                    f"changed or unknown migrations: {', '.join(bad)}",
                    "restore the migration files of the version that created this database",
                )
            )
        elif pending and engine.dialect.name == "postgresql":
            out.append(
                Check(
                    "schema",
                    Level.FAIL,
                    f"{len(pending)} pending: {', '.join(pending[:3])}{', …' if len(pending) > 3 else ''}",
                    "run `aivedio db upgrade`",
                )
            )
        elif pending:
            out.append(
                Check(
                    "schema",
                    Level.WARN,
                    "not created yet",
                    "created by the first `aivedio serve` or `aivedio generate` (or `aivedio db upgrade`)",
                )
            )
        else:
            out.append(Check("schema", Level.OK, f"up to date at {applied[-1] if applied else '(none)'}"))
        return out

    def _clock(self) -> list[Check]:
        from aivedio_engine.db import heartbeats
        from aivedio_engine.db.session import read_conn

        if not self.settings.is_postgres:
            return [Check("clock", Level.OK, "SQLite: the database shares this host's clock")]
        if self._db_down:
            return [Check("clock", Level.WARN, "not checked: no database to compare with")]
        before = self.clock.now()
        with read_conn(self.engine()) as conn:
            db_now = heartbeats.database_now(conn)
        after = self.clock.now()
        assert db_now is not None
        # the server read its clock somewhere in the round trip: compare with its middle
        skew = (db_now - (before + (after - before) / 2)).total_seconds()
        detail = f"this host is {abs(skew):.2f} s {'behind' if skew > 0 else 'ahead of'} the database"
        if abs(skew) >= SKEW_FAIL_S:
            return [Check("clock", Level.FAIL, detail, "synchronise the clocks (NTP): ages and deadlines are wrong")]
        if abs(skew) >= SKEW_WARN_S:
            return [Check("clock", Level.WARN, detail, "synchronise the clocks (NTP)")]
        return [Check("clock", Level.OK, detail)]

    # --- redis and the broker ------------------------------------------------------------------------------

    def _redis(self) -> list[Check]:
        if self.settings.mode == "embedded" and self.settings.broker.kind != "redis":
            return [Check("redis", Level.OK, NOT_EMBEDDED)]
        return [_ping_redis("redis", self.settings.redis.url)]

    def _broker(self) -> list[Check]:
        kind = self.settings.broker.kind
        if kind == "stub":
            return [Check("broker", Level.OK, f"in-process (stub): {NOT_EMBEDDED}")]
        if kind == "redis":
            return [_ping_redis("broker", self.settings.broker.url)]
        import pika

        params = pika.URLParameters(self.settings.broker.url)
        params.connection_attempts = 1
        params.socket_timeout = _TIMEOUT_S
        params.blocked_connection_timeout = _TIMEOUT_S
        started = time.monotonic()
        try:
            connection = pika.BlockingConnection(params)
        except Exception as exc:  # noqa: BLE001 - pika raises many unrelated types for "cannot connect"
            return [
                Check(
                    "broker",
                    Level.FAIL,
                    f"RabbitMQ {_safe_url(self.settings.broker.url)}: unreachable: {_first_line(exc)}",
                    "check broker.url (user, password, vhost) and that RabbitMQ is running",
                )
            ]
        latency_ms = (time.monotonic() - started) * 1000
        connection.close()
        return [
            Check(
                "broker", Level.OK, f"RabbitMQ {_safe_url(self.settings.broker.url)}: connected in {latency_ms:.0f} ms"
            )
        ]

    # --- storage -------------------------------------------------------------------------------------------

    def _storage(self) -> list[Check]:
        store = self.storage()
        key = f"doctor/{new_id()}"
        payload = b"aivedio doctor probe\n"
        where = (
            f"s3 bucket {self.settings.storage.bucket}"
            if self.settings.storage.kind == "s3"
            else f"fs {self.settings.storage.root or self.settings.data_dir / 'objects'}"
        )
        started = time.monotonic()
        try:
            store.put_stream(key, [payload], "text/plain", len(payload))
            with store.open_read(key) as f:
                back = f.read()
            store.delete(key)
        except Exception as exc:  # noqa: BLE001 - any store error is the finding
            return [
                Check(
                    "storage",
                    Level.FAIL,
                    f"{where}: write/read/delete probe failed: {_first_line(exc)}",
                    "check [storage] (bucket, endpoint, credentials, or the directory's permissions)",
                )
            ]
        if back != payload:
            return [Check("storage", Level.FAIL, f"{where}: read back different bytes", "check the object store")]
        ms = (time.monotonic() - started) * 1000
        return [Check("storage", Level.OK, f"{where}: write, read, delete in {ms:.0f} ms")]

    # --- providers -----------------------------------------------------------------------------------------

    def _providers(self) -> list[Check]:
        out = []
        for name, cfg in sorted(self.settings.providers.items()):
            label = f"provider {name}"
            if not cfg.enabled:
                out.append(Check(label, Level.OK, "disabled"))
                continue
            lookup = "lookup by request key" if cfg.supports_lookup_by_request_key else "no lookup by request key"
            if cfg.adapter in ("local", "sim") and not cfg.base_url:
                out.append(Check(label, Level.OK, f"{cfg.adapter} adapter, nothing to reach; {lookup}"))
                continue
            if cfg.adapter not in ("local", "sim") and not cfg.api_key.get_secret_value():
                out.append(
                    Check(
                        label,
                        Level.FAIL,
                        f"{cfg.adapter}: no API key configured",
                        f"set AIVEDIO_PROVIDERS__{name.upper()}__API_KEY",
                    )
                )
                continue
            if not cfg.base_url:
                out.append(Check(label, Level.OK, f"{cfg.adapter}: credentials set; vendor default URL; {lookup}"))
                continue
            out.append(_reach(label, cfg.adapter, cfg.base_url, lookup))
        if not any(c.supports_lookup_by_request_key for c in self.settings.providers.values() if c.enabled):
            out.append(
                Check(
                    "provider lookup",
                    Level.WARN,
                    "no enabled provider can look a job up by request key",
                    "ambiguous submits can only be resolved by callbacks or job listing",
                )
            )
        return out

    # --- roles ---------------------------------------------------------------------------------------------

    def _roles(self) -> list[Check]:
        if self._db_down:
            return [Check("roles", Level.WARN, "not checked: no database to read the heartbeats from")]
        from aivedio_engine.db.handles import SQLAlchemyError

        try:
            report = self.liveness().report()
        except SQLAlchemyError as exc:
            return [
                Check(
                    "roles",
                    Level.FAIL,
                    f"heartbeats unreadable: {_first_line(getattr(exc, 'orig', None) or exc)}",
                    "run `aivedio db upgrade` (migration 0017 adds process_heartbeats)",
                )
            ]
        self._report = report
        missing_s = self.settings.alerts.role_missing_s
        out = []
        for r in report.roles:
            if r.alive:
                seen = f"seen {r.last_seen_age_s:.0f} s ago" if r.last_seen_age_s is not None else ""
                out.append(Check(f"role {r.role}", Level.OK, f"{r.alive} alive, {seen}".rstrip(", ")))
                continue
            seen = r.seen
            advice = f"start `aivedio serve --role {r.role}` (or `aivedio serve` for all roles)"
            if r.missing(missing_s):
                out.append(Check(f"role {r.role}", Level.FAIL, f"none alive ({seen}) while {r.waiting} wait", advice))
            elif r.required and r.waiting:  # gone for less than role_missing_s: a restart, or the start of an outage
                out.append(Check(f"role {r.role}", Level.WARN, f"none alive ({seen}) while {r.waiting} wait", advice))
            else:
                out.append(Check(f"role {r.role}", Level.WARN, f"none alive ({seen}); nothing waits for it", advice))
        return out


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout


def _ping_redis(name: str, url: str) -> Check:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=_TIMEOUT_S, socket_timeout=_TIMEOUT_S)
    started = time.monotonic()
    try:
        client.ping()
    except redis.RedisError as exc:
        return Check(
            name, Level.FAIL, f"{_safe_url(url)}: unreachable: {_first_line(exc)}", "check the URL and that Redis runs"
        )
    finally:
        client.close()
    return Check(name, Level.OK, f"{_safe_url(url)}: PING in {(time.monotonic() - started) * 1000:.1f} ms")


def _reach(label: str, adapter: str, base_url: str, lookup: str) -> Check:
    from aivedio_engine.httpclient import HttpClient, Timeouts, TransportError

    client = HttpClient(timeouts=Timeouts(connect=_TIMEOUT_S, read=_TIMEOUT_S, write=_TIMEOUT_S, pool=_TIMEOUT_S))
    started = time.monotonic()
    try:
        # any HTTP answer (even 401/404) proves the vendor is reachable; credentials are checked by real calls
        status = client.request("GET", base_url).status
    except TransportError as exc:
        return Check(label, Level.FAIL, f"{adapter}: {base_url} unreachable: {exc}", "check base_url and egress")
    finally:
        client.close()
    ms = (time.monotonic() - started) * 1000
    return Check(label, Level.OK, f"{adapter}: {base_url} answered HTTP {status} in {ms:.0f} ms; {lookup}")


def _safe_url(url: str) -> str:
    return re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", url)


def _first_line(exc: object) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
