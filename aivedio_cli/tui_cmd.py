"""`aivedio tui`: open the Textual dashboard.

Textual and the `tui` package are loaded only when this command runs — `aivedio --help` and every other
command start without them (tests/architecture). Front ends do not import each other; this launcher
is the one sanctioned crossing: it hands the TUI an `AppContext` built from the CLI's global options.
"""

from __future__ import annotations

import sys

import typer

from aivedio_cli._params import duration_option
from aivedio_cli._render import ExitCode, fail
from aivedio_cli._services import service_context


def tui(
    ctx: typer.Context,
    readonly: bool = typer.Option(False, "--readonly", help="Refuse every change: browse and inspect only."),
    refresh: float = duration_option("2s", "--refresh", help="How often the overview re-reads the live figures"),
) -> None:
    """Interactive dashboard for operators and reviewers: overview, tasks + timeline, review queue,
    SUBMIT_UNKNOWN, DLQ/orphans, ledger (+ adjust), capacity, audit checks, alerts (acknowledge/resolve, Space
    marks several).

    k9s keys: ? help, / filter, : go to a screen (or a task id), Esc back, 1-9 switch screens, q quit. Every
    change asks for confirmation and a reason (stored in the audit log); --readonly refuses them all.
    """
    if not 0.5 <= refresh <= 3600:
        fail(f"--refresh must be between 0.5s and 1h, got {refresh:g}s", ExitCode.USAGE)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        fail(
            "aivedio tui needs an interactive terminal (use the other commands, e.g. `tasks list --json`, in scripts)",
            ExitCode.USAGE,
        )
    try:
        import tui.app as launcher  # lazy on purpose: only this command loads Textual
    except ImportError as exc:  # textual is a dependency, but a trimmed install may lack it
        fail(f"the dashboard is unavailable: {exc}")
    with service_context(ctx) as app_ctx:
        launcher.run(app_ctx, readonly=readonly, refresh_s=refresh)
