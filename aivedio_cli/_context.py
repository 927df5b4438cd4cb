"""Per-invocation state: the global options, and settings loaded lazily once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import typer

from aivedio_cli._render import ExitCode, fail

if TYPE_CHECKING:  # the config model loads pydantic: only when a command needs settings, not at start-up
    from aivedio_engine.config import Settings


@dataclass
class CliState:
    config_path: str | None = None
    set_items: list[str] = field(default_factory=list)
    _settings: Settings | None = None

    def settings(self, **cli_args: object) -> Settings:
        """Effective settings; `cli_args` are nested dicts of values given as command options (highest rank)."""
        from aivedio_engine.config import ConfigError, load_settings, merge_overrides

        if self._settings is not None and not cli_args:
            return self._settings
        try:
            overrides = merge_overrides(self.set_items)
            for key, value in cli_args.items():
                if value is not None:
                    overrides[key] = value
            settings = load_settings(self.config_path, overrides)
        except ConfigError as exc:
            fail(str(exc), ExitCode.USAGE, "config")
        if not cli_args:
            self._settings = settings
        return settings


def state(ctx: typer.Context) -> CliState:
    obj = ctx.find_root().obj
    if not isinstance(obj, CliState):  # a sub-app invoked on its own, e.g. in a test
        obj = CliState()
        ctx.find_root().obj = obj
    return obj
