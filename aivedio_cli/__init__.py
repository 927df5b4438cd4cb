"""aivedio's command line: a root Typer app and one module per command group. Never imports textual at start-up."""
