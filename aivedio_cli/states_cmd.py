"""`aivedio states`: print a state machine (task, attempt, System B step or project) as a table, JSON, Mermaid or
Graphviz dot."""

from __future__ import annotations

from enum import StrEnum

import typer

from aivedio_cli._render import emit_json, out
from aivedio_engine.domain.machine import Machine
from aivedio_engine.domain.project import PROJECT_MACHINE
from aivedio_engine.domain.transitions import ATTEMPT_MACHINE, TASK_MACHINE
from aivedio_engine.domain.workflow import STEP_MACHINE


class MachineName(StrEnum):
    TASK = "task"
    ATTEMPT = "attempt"
    STEP = "step"
    PROJECT = "project"


class Format(StrEnum):
    TABLE = "table"
    JSON = "json"
    MERMAID = "mermaid"
    DOT = "dot"


MACHINES: dict[MachineName, Machine] = {
    MachineName.TASK: TASK_MACHINE,
    MachineName.ATTEMPT: ATTEMPT_MACHINE,
    MachineName.STEP: STEP_MACHINE,
    MachineName.PROJECT: PROJECT_MACHINE,
}


def states(
    machine: MachineName = typer.Option(MachineName.TASK, "--machine", "-m", help="Which state machine."),
    fmt: Format = typer.Option(Format.TABLE, "--format", "-f", help="Output format."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json, like every other command."),
) -> None:
    """Print a state machine: one line per allowed (state, event) edge; groups of sources are expanded."""
    if as_json:
        fmt = Format.JSON
    m = MACHINES[machine]
    edges = m.edges()
    if fmt is Format.JSON:
        emit_json([{"from": e.source.value, "event": e.event.value, "to": e.target.value} for e in edges])
    elif fmt is Format.MERMAID:
        typer.echo(to_mermaid(m))
    elif fmt is Format.DOT:
        typer.echo(to_dot(m))
    else:
        from rich.table import Table

        table = Table(
            title=f"{m.name} state machine — {len(edges)} edges; terminal: "
            + ", ".join(s.value for s in m.states if s in m.terminal)
        )
        for col in ("from", "event", "to", "condition / effect"):
            table.add_column(col)
        for e in edges:
            table.add_row(e.source.value, e.event.value, e.target.value, e.note)
        out().print(table)


def to_mermaid(m: Machine) -> str:
    lines = ["stateDiagram-v2", f"    [*] --> {m.initial.value}"]
    lines += [f"    {e.source.value} --> {e.target.value}: {e.event.value}" for e in m.edges()]
    lines += [f"    {s.value} --> [*]" for s in m.states if s in m.terminal]
    return "\n".join(lines)


def to_dot(m: Machine) -> str:
    lines = [f'digraph "{m.name}" {{', "    rankdir=LR;", "    node [shape=box, style=rounded];"]
    lines += [f'    "{s.value}" [peripheries=2];' for s in m.states if s in m.terminal]
    lines += [f'    "{e.source.value}" -> "{e.target.value}" [label="{e.event.value}"];' for e in m.edges()]
    lines.append("}")
    return "\n".join(lines)
