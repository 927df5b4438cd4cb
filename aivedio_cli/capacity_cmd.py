"""`aivedio capacity estimate` (placeholder until the capacity model lands)."""

import typer

app = typer.Typer(help="Capacity planning with Little's law (seed 000 §4.10).", no_args_is_help=True)
