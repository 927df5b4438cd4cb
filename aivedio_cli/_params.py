"""Option conventions shared by every command: durations, and Tab completion of the values an operator types.

Loaded whenever a command module is (completion imports them too), so nothing heavy at import: statuses come from
the domain enums, providers and models from the settings (no database), tenants from the database, lazily.
A completion function never raises: a broken config or an unreachable database just completes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from aivedio_engine.domain.durations import HINT, parse_seconds


def duration_s(value: str | float) -> float:
    """Typer `parser` of every duration option: `90`, `90s`, `10m`, `1h`, `2d` → seconds (a usage error if not)."""
    if isinstance(value, int | float):  # a default given as a number
        return float(value)
    try:
        return parse_seconds(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def duration_option(default: Any, *flags: str, help: str, **kwargs: Any) -> Any:
    """A duration option: accepts 90s / 10m / 1h / 2d (a bare number is seconds); the value is seconds."""
    return typer.Option(default, *flags, parser=duration_s, metavar="DURATION", help=f"{help} ({HINT}).", **kwargs)


def _matching(values: list[str], incomplete: str) -> list[str]:
    return [v for v in values if v.lower().startswith(incomplete.lower())]


def complete_task_status(incomplete: str) -> list[str]:
    from aivedio_engine.domain.status import TaskStatus

    return _matching([s.value for s in TaskStatus], incomplete)


def complete_webhook_state(incomplete: str) -> list[str]:
    from aivedio_engine.domain.status import WebhookDeliveryState

    return _matching([s.value for s in WebhookDeliveryState], incomplete)


def _settings(ctx: typer.Context) -> Any:
    """The settings the command line names: completion runs before the root callback, so read its raw params."""
    from aivedio_engine.config import load_settings, merge_overrides

    root = ctx.find_root().params
    return load_settings(root.get("config"), merge_overrides(list(root.get("set_items") or [])))


def _provider_models(ctx: typer.Context) -> dict[str, list[str]]:
    """Enabled provider → model names: read from the files without pydantic when possible (_fast_config says why),
    else from the full settings."""
    from aivedio_cli._fast_config import provider_models

    root = ctx.find_root().params
    fast = provider_models(root.get("config"), list(root.get("set_items") or []))
    if fast is not None:
        return fast
    providers = _settings(ctx).providers
    return {name: sorted(p.models) for name, p in providers.items() if p.enabled}


def complete_provider(ctx: typer.Context, incomplete: str) -> list[str]:
    try:
        providers = _provider_models(ctx)
    except Exception:  # noqa: BLE001 - see module docstring
        return []
    return _matching(sorted(providers), incomplete)


def complete_model(ctx: typer.Context, incomplete: str) -> list[str]:
    try:
        providers = _provider_models(ctx)
    except Exception:  # noqa: BLE001 - see module docstring
        return []
    only = ctx.params.get("provider")
    names = {m for name, models in providers.items() if only in (None, name) for m in models}
    return _matching(sorted(names), incomplete)


def complete_tenant(ctx: typer.Context, incomplete: str) -> list[str]:
    """Tenant names from the database (the one completion that reads it): an embedded SQLite file is read with the
    standard library and a PostgreSQL server with psycopg alone (importing SQLAlchemy and the settings took 1.8-3.9 s
    a Tab press); anything this fast path cannot read goes through the engine."""
    try:
        from aivedio_cli._fast_config import database_target, embedded_tenant_names, server_tenant_names

        root = ctx.find_root().params
        target = database_target(root.get("config"), list(root.get("set_items") or []))
        if isinstance(target, Path):
            return _matching(embedded_tenant_names(target), incomplete)
        if target is not None:
            return _matching(server_tenant_names(target), incomplete)
        from aivedio_engine.db import tenants
        from aivedio_engine.db.engine import make_engine

        settings = _settings(ctx)
        url = settings.database_url
        if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
            return []  # embedded and never used: do not create a database to complete a name
        engine = make_engine(settings)
        try:
            with engine.connect() as conn:
                names = [t.name for t in tenants.summaries(conn)]
        finally:
            engine.dispose()
    except Exception:  # noqa: BLE001 - see module docstring
        return []
    return _matching(names, incomplete)
