"""`aivedio config show`: the effective settings, secrets masked."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console

from aivedio_cli._context import state
from aivedio_cli._render import emit_json, out
from aivedio_engine.config import mask_secrets, masked_dump, resolve_config_path

app = typer.Typer(help="Inspect the effective configuration.", no_args_is_help=True)


@app.command("show")
def show(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Print the effective settings (CLI > AIVEDIO_* env > TOML file > defaults), secrets masked."""
    cli = state(ctx)
    settings = cli.settings()
    data = masked_dump(settings)
    data["database_url_effective"] = mask_secrets(settings.database_url)
    if as_json:
        emit_json(data)
        return
    source = resolve_config_path(cli.config_path)
    console = out()
    console.print(f"[bold]config file:[/] {source or '(none: defaults and environment only)'}")
    _print_tree(console, data, "")


def _print_tree(console: Console, data: dict[str, Any], prefix: str) -> None:
    for key in sorted(data):
        value = data[key]
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            _print_tree(console, value, name + ".")
        else:
            console.print(f"{name} = {value!r}", markup=False, highlight=False)
