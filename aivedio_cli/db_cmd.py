"""`aivedio db upgrade|status` (placeholder until the migration runner lands)."""

import typer

app = typer.Typer(help="Database schema: apply and inspect migrations.", no_args_is_help=True)
