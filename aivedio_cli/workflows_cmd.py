"""`aivedio workflows list|describe`: the built-in System B workflows and their step graphs."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import typer
from rich.table import Table

from aivedio_cli._render import ExitCode, emit_json, fail, out
from aivedio_engine.domain.project import StepDef
from aivedio_engine.domain.workflow import STEP_SPECS
from aivedio_engine.workflows import catalog

app = typer.Typer(help="Workflows: multi-step productions (photo check → plan → … → delivery).")


class Format(StrEnum):
    TABLE = "table"
    JSON = "json"
    MERMAID = "mermaid"


@app.command("list")
def list_workflows(json_out: bool = typer.Option(False, "--json", help="One JSON object per workflow.")) -> None:
    """The workflows a project can run."""
    workflows = list(catalog.WORKFLOWS.values())
    if json_out:
        emit_json([{"name": w.name, "description": w.description, "steps": len(w.steps)} for w in workflows])
        return
    table = Table(title="workflows")
    table.add_column("name", no_wrap=True)
    table.add_column("steps")
    table.add_column("description")
    for w in workflows:
        table.add_row(w.name, str(len(w.steps)), w.description)
    out().print(table)


@app.command("describe")
def describe(
    name: str = typer.Argument(..., help="Workflow name (see `aivedio workflows list`)."),
    fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="table, json or mermaid (a flowchart)."),
) -> None:
    """Each step of a workflow: what it needs, its queue, timeout, retries and whether it holds the project lock."""
    try:
        wf = catalog.get(name)
    except KeyError as exc:
        fail(str(exc.args[0]), ExitCode.NOT_FOUND)
    if fmt is Format.MERMAID:
        typer.echo(wf.mermaid())
        return
    if fmt is Format.JSON:
        emit_json({"name": wf.name, "description": wf.description, "steps": [_step_json(s) for s in wf.order()]})
        return
    table = Table(title=f"{wf.name}: {wf.description}")
    for col in ("step", "type", "needs", "queue", "timeout", "retries", "lock"):
        table.add_column(col, no_wrap=True)  # names are copied into commands: never cut
    table.add_column("description")
    for s in wf.order():
        spec = STEP_SPECS[s.type]
        table.add_row(
            _label(s),
            s.type.value,
            ", ".join(s.needs) or "—",
            spec.queue.value,
            f"{spec.timeout_s // 60} min",
            str(spec.max_retry),
            "yes" if spec.needs_lock else "",
            s.description,
        )
    out().print(table)


def _label(s: StepDef) -> str:
    return s.key + ("[shot]" if s.per_shot else "")


def _step_json(s: StepDef) -> dict[str, Any]:
    spec = STEP_SPECS[s.type]
    return {
        "step": _label(s),
        "type": s.type.value,
        "needs": list(s.needs),
        "queue": spec.queue.value,
        "timeout_s": spec.timeout_s,
        "max_retry": spec.max_retry,
        "retry_schedule_s": list(spec.retry_schedule_s),
        "project_lock": spec.needs_lock,
        "generation_task": spec.vendor,
        "description": s.description,
    }
