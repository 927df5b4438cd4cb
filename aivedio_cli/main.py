"""The root `aivedio` command: global options, and the table of commands.

Start-up is on every command and every Tab press, so this module imports no command module (`_group` says why
and how). TO ADD A COMMAND: write `aivedio_cli/<name>_cmd.py` with a `typer.Typer` app (a group) or a function
(one command), keep its heavy imports (SQLAlchemy, services, bootstrap…) inside its functions, and add ONE line
to COMMANDS below — name, "module:attribute", and the line `aivedio --help` shows (the start of the module's own
help; tests/cli/test_conventions.py checks they agree and that start-up stays light).
"""

from __future__ import annotations

import typer

from aivedio_cli._context import CliState
from aivedio_cli._group import LazyCommand, LazyGroup

COMMANDS: tuple[LazyCommand, ...] = (
    LazyCommand("config", "aivedio_cli.config_cmd:app", "Inspect the effective configuration."),
    LazyCommand("db", "aivedio_cli.db_cmd:app", "Database schema: apply and inspect migrations."),
    LazyCommand("capacity", "aivedio_cli.capacity_cmd:app", "Capacity planning with Little's law."),
    LazyCommand("tenants", "aivedio_cli.tenants_cmd:tenants_app", "Tenants: create, list and set their limits."),
    LazyCommand("keys", "aivedio_cli.tenants_cmd:keys_app", "API keys: create (shown once) and revoke."),
    LazyCommand("generate", "aivedio_cli.generate_cmd:generate", "Generate one video."),
    LazyCommand("batch", "aivedio_cli.generate_cmd:batch_app", "Run many generations from a JSONL file."),
    LazyCommand(
        "generations", "aivedio_cli.generations_cmd:app", "Your generations: get, wait for, list, download, cancel."
    ),
    LazyCommand("models", "aivedio_cli.models_cmd:app", "The models generations can use."),
    LazyCommand("states", "aivedio_cli.states_cmd:states", "Print a state machine."),
    LazyCommand("serve", "aivedio_cli.serve_cmd:serve", "Run aivedio's process roles until SIGTERM or Ctrl-C."),
    LazyCommand("sim-provider", "aivedio_cli.sim_cmd:sim_provider", "Run a simulated video-generation vendor."),
    LazyCommand(
        "replay",
        "aivedio_cli.replay_cmd:app",
        "Replay dead letters, orphan provider events, DEAD outbox rows and lost provider observations.",
    ),
    LazyCommand(
        "ledger",
        "aivedio_cli.ledger_cmd:app",
        "The credit ledger: balances, entries, adjustments, invoice reconciliation.",
    ),
    LazyCommand("review", "aivedio_cli.review_cmd:app", "Manual review queue: list, claim, approve, reject."),
    LazyCommand("audit", "aivedio_cli.audit_cmd:audit", "Check the invariants I1-I10 that our own tables can answer."),
    LazyCommand("alerts", "aivedio_cli.alerts_cmd:app", "Engine alerts: list, acknowledge, resolve."),
    LazyCommand(
        "tasks", "aivedio_cli.tasks_cmd:app", "Generation tasks: list, show a timeline, follow state changes, cancel."
    ),
    LazyCommand("reconcile", "aivedio_cli.reconcile_cmd:reconcile", "Resolve SUBMIT_UNKNOWN tasks now."),
    LazyCommand("tui", "aivedio_cli.tui_cmd:tui", "Interactive dashboard for operators and reviewers."),
    LazyCommand("storage", "aivedio_cli.storage_cmd:app", "The object store: orphan objects (scan, gc)."),
    LazyCommand(
        "webhooks", "aivedio_cli.webhooks_cmd:app", "Signed webhooks to a tenant's endpoints, and their delivery log."
    ),
    LazyCommand("workflows", "aivedio_cli.workflows_cmd:app", "Workflows: multi-step productions."),
    LazyCommand(
        "projects",
        "aivedio_cli.projects_cmd:app",
        "System B projects: run a workflow (photo + script → video) and follow its steps.",
    ),
    LazyCommand(
        "doctor",
        "aivedio_cli.doctor_cmd:doctor",
        "Check ffmpeg, fonts, the database and its schema, Redis, the broker, storage, providers",
    ),
    LazyCommand(
        "status",
        "aivedio_cli.doctor_cmd:status",
        "Engine processes and their roles: alive, stale (not seen lately) or stopped, with ages and backlog.",
    ),
)


class AivedioGroup(LazyGroup):
    lazy_commands = COMMANDS


app = typer.Typer(
    name="aivedio",
    cls=AivedioGroup,
    help="aivedio: orchestration engine for AI video generation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # plain help for the root: Typer's Rich help layer alone takes ~0.3 s to import (each command keeps its own)
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        from aivedio_engine import __version__  # reads the installed metadata: only when asked

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
