"""Provider and model names for shell completion, read without the settings model.

Importing pydantic and building `Settings` costs about a second on a busy machine, far over the 0.5 s a Tab press
may take (issue 15). The names depend on few inputs — the TOML file, `--set` overrides and the built-in `local`
provider — so they are read here with tomllib, merged the way pydantic-settings merges its sources (init
arguments deep-merged over the file; a `providers` table anywhere replaces the built-in one), and checked
against `default_provider` as `Settings` does. Anything this reader does not model — an `AIVEDIO_PROVIDERS…` or
`AIVEDIO_DEFAULT_PROVIDER` environment variable (JSON values, `_FILE` secrets, case folding) — returns None and the
caller takes the full settings path. tests/cli/test_completion_fast.py checks both paths give the same names.
"""

from __future__ import annotations

import os
import sqlite3
import tomllib
from pathlib import Path
from typing import Any

from aivedio_engine.config_files import deep_merge, merge_overrides, resolve_config_path

#: the providers `Settings` has when no source names any (config._default_providers): name → its models
BUILTIN_PROVIDERS: dict[str, dict[str, Any]] = {"local": {"models": {"local-v1": {}}}}
BUILTIN_DEFAULT_PROVIDER = "local"
#: environment variables this reader does not interpret: with any of them set, the full path decides
_ENV_PREFIXES = ("AIVEDIO_PROVIDERS", "AIVEDIO_DEFAULT_PROVIDER")
_FALSE = {"0", "false", "f", "no", "n", "off"}


_TRUE = {"1", "true", "t", "yes", "y", "on"}


def _enabled(value: Any) -> bool | None:
    """pydantic's bool coercion of what a file or `--set` gives; None for a value it refuses."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    return False if text in _FALSE else True if text in _TRUE else None


def provider_models(config: str | None, set_items: list[str]) -> dict[str, list[str]] | None:
    """Enabled provider → its model names, as `load_settings(config, merge_overrides(set_items))` would give;
    {} when those settings would be refused for a reason seen here; None when only the full path can tell."""
    if any(name.upper().startswith(_ENV_PREFIXES) for name in os.environ):
        return None
    path = resolve_config_path(config)
    merged: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8")) if path else {}
    deep_merge(merged, merge_overrides(set_items))
    providers = merged.get("providers", BUILTIN_PROVIDERS)
    if not isinstance(providers, dict) or merged.get("default_provider", BUILTIN_DEFAULT_PROVIDER) not in providers:
        return {}  # Settings._coherent refuses it
    out: dict[str, list[str]] = {}
    for name, table in providers.items():
        if not isinstance(table, dict):
            return None
        enabled = _enabled(table.get("enabled", True))
        if enabled is None:
            return {}  # the settings would be refused: the full path completes nothing either
        if enabled:
            models = table.get("models", {})
            out[name] = sorted(models) if isinstance(models, dict) else []
    return out


#: environment variables that can move the database: with any of them set, the full path decides
_DB_ENV = ("AIVEDIO_DATABASE", "AIVEDIO_DATA_DIR")


def embedded_database(config: str | None, set_items: list[str]) -> Path | None:
    """The SQLite file `Settings.database_url` names when the database is embedded (no `database.url` set), read
    without the settings model; None when the database is not embedded or only the full path can tell."""
    target = database_target(config, set_items)
    return target if isinstance(target, Path) else None


def database_target(config: str | None, set_items: list[str]) -> Path | str | None:
    """Where `Settings.database_url` points, read without the settings model: the embedded SQLite file (a Path) or
    a PostgreSQL server (its URL in libpq form, a str); None when only the full path can tell (an environment
    variable that may move the database, another kind of URL)."""
    if any(name.upper().startswith(_DB_ENV) for name in os.environ):
        return None
    path = resolve_config_path(config)
    merged: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8")) if path else {}
    deep_merge(merged, merge_overrides(set_items))
    database = merged.get("database", {})
    if not isinstance(database, dict):
        return None
    url = database.get("url")
    if not url:
        return Path(str(merged.get("data_dir", ".aivedio"))) / "aivedio.db"
    scheme, sep, rest = str(url).partition("://")
    if sep and scheme in ("postgresql", "postgresql+psycopg"):
        return f"postgresql://{rest}"
    return None


def embedded_tenant_names(db: Path) -> list[str]:
    """Tenant names straight from the embedded SQLite file, read-only (nothing is created when it is missing)."""
    if not db.is_file():
        return []
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=0.2)
    try:
        return [str(r[0]) for r in conn.execute("SELECT name FROM tenants ORDER BY created_at")]  # as tenants.summaries
    finally:
        conn.close()


def server_tenant_names(url: str, connect_timeout_s: int = 2) -> list[str]:
    """Tenant names straight from a PostgreSQL server, with psycopg alone: importing SQLAlchemy and the settings
    model for one Tab press cost 1.8-3.9 s on this machine. A read in autocommit (no transaction is left open)."""
    import psycopg

    with psycopg.connect(url, connect_timeout=connect_timeout_s, autocommit=True) as conn:
        rows = conn.execute("SELECT name FROM tenants ORDER BY created_at").fetchall()  # as tenants.summaries
    return [str(r[0]) for r in rows]
