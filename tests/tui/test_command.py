"""`aivedio tui` as a command: registered, lazy (no textual at CLI start-up, see tests/architecture), and refusing
to start without a terminal instead of drawing into a pipe."""

from __future__ import annotations

from typer.testing import CliRunner

from aivedio_cli.main import app


def test_tui_is_listed_and_documents_its_keys() -> None:
    result = CliRunner().invoke(app, ["tui", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "--readonly" in result.output and "? help" in result.output


def test_tui_without_a_terminal_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["tui", "--readonly"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: aivedio tui needs an interactive terminal")
