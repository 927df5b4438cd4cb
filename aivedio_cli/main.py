"""The root `aivedio` command: global options, and one sub-app per command group."""

from __future__ import annotations

import typer

from aivedio_cli import (
    alerts_cmd,
    audit_cmd,
    capacity_cmd,
    config_cmd,
    db_cmd,
    generate_cmd,
    generations_cmd,
    ledger_cmd,
    models_cmd,
    reconcile_cmd,
    replay_cmd,
    review_cmd,
    serve_cmd,
    sim_cmd,
    states_cmd,
    storage_cmd,
    tasks_cmd,
    tenants_cmd,
    tui_cmd,
)
from aivedio_cli._context import CliState
from aivedio_engine import __version__

app = typer.Typer(
    name="aivedio",
    help="aivedio: orchestration engine for AI video generation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(config_cmd.app, name="config")
app.add_typer(db_cmd.app, name="db")
app.add_typer(capacity_cmd.app, name="capacity")
app.add_typer(tenants_cmd.tenants_app, name="tenants")
app.add_typer(tenants_cmd.keys_app, name="keys")
app.command("generate")(generate_cmd.generate)
app.add_typer(generate_cmd.batch_app, name="batch")
app.add_typer(generations_cmd.app, name="generations")
app.add_typer(models_cmd.app, name="models")
app.command("states")(states_cmd.states)
app.command("serve")(serve_cmd.serve)
app.command("sim-provider")(sim_cmd.sim_provider)
app.add_typer(replay_cmd.app, name="replay")
app.add_typer(ledger_cmd.app, name="ledger")
app.add_typer(review_cmd.app, name="review")
app.command("audit")(audit_cmd.audit)
app.add_typer(alerts_cmd.app, name="alerts")
app.add_typer(tasks_cmd.app, name="tasks")
app.command("reconcile")(reconcile_cmd.reconcile)
app.command("tui")(tui_cmd.tui)
app.add_typer(storage_cmd.app, name="storage")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"aivedio {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    config: str | None = typer.Option(
        None, "--config", "-c", metavar="PATH", help="TOML config file (default: $AIVEDIO_CONFIG, else ./aivedio.toml)."
    ),
    set_items: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="Override one setting, e.g. --set database.url=postgresql+psycopg://..."
    ),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    ctx.obj = CliState(config_path=config, set_items=list(set_items))


def run() -> None:
    app()
