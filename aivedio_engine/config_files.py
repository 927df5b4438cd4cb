"""Which configuration file is read, and `--set` overrides: the parts of the configuration that need no pydantic.

Split out of config.py (which re-exports every name) so shell completion can read provider and model names and
the database URL in a fraction of the time that importing the settings model takes (aivedio_cli/_fast_config.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DEFAULT_CONFIG_FILE = "aivedio.toml"
CONFIG_ENV_VAR = "AIVEDIO_CONFIG"


class ConfigError(Exception):
    """A configuration file or value is invalid; the message is one line naming the key."""


def resolve_config_path(explicit: str | os.PathLike[str] | None) -> Path | None:
    """The file to read: explicit > $AIVEDIO_CONFIG > ./aivedio.toml if present. Missing explicit files are errors."""
    chosen = explicit or os.environ.get(CONFIG_ENV_VAR)
    if chosen:
        path = Path(chosen)
        if not path.is_file():
            source = "--config" if explicit else CONFIG_ENV_VAR
            raise ConfigError(f"config file not found: {path} (from {source})")
        return path
    default = Path(DEFAULT_CONFIG_FILE)
    return default if default.is_file() else None


def parse_override(item: str) -> dict[str, Any]:
    """`section.key=value` → nested dict for load_settings(overrides=...). Values stay strings; pydantic coerces."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"invalid --set {item!r}: expected KEY=VALUE, e.g. database.url=postgresql+psycopg://...")
    out: dict[str, Any] = {}
    node = out
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def merge_overrides(items: list[str]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for item in items:
        deep_merge(merged, parse_override(item))
    return merged


def deep_merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            deep_merge(into[k], v)
        else:
            into[k] = v
