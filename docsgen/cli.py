"""The CLI reference, walked from the Typer app: every command of the COMMANDS table in aivedio_cli/main.py (each
one loaded here, as running it would), its help, usage, arguments and options."""

from __future__ import annotations

import typer
from typer import _click as click
from typer.core import TyperGroup

from aivedio_cli.main import app

#: options every command has; listed once, not under each command
_SKIP = {"--help"}


def render() -> str:
    root = typer.main.get_command(app)
    ctx = click.Context(root, info_name="aivedio")
    out: list[str] = []
    _command(root, ctx, out, depth=0)
    return "\n".join(out)


def _command(command: click.Command, ctx: click.Context, out: list[str], depth: int) -> None:
    path = ctx.command_path
    out += [f"{'#' * min(3 + depth, 5)} `{path}`", ""]
    if command.help:
        out += [" ".join(paragraph.split()) + "\n" for paragraph in command.help.split("\n\n")]
    arguments = [p for p in command.get_params(ctx) if p.param_type_name == "argument"]
    usage = [path, "[OPTIONS]"] + [_argument_usage(a) for a in arguments]
    if isinstance(command, TyperGroup):
        usage.append("COMMAND [ARGS]...")
    out += ["```", " ".join(usage), "```", ""]
    rows = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None or any(name in _SKIP for name in param.opts):
            continue
        names, text = record
        if param.param_type_name == "argument":
            names = _argument_usage(param) + " " + names.partition(" ")[2]
        meaning = " ".join(text.split()).replace("|", "\\|") or "—"
        rows.append(f"| `{names}` | {meaning} |")
    if rows:
        out += ["| argument / option | meaning |", "|---|---|", *rows, ""]
    if isinstance(command, TyperGroup):
        for name in command.list_commands(ctx):
            # resolving loads a lazy command's module (aivedio_cli._group.LazyGroup), as running it would
            _, sub, _ = command.resolve_command(ctx, [name])
            if sub is not None and not sub.hidden:
                _command(sub, click.Context(sub, info_name=name, parent=ctx), out, depth + 1)


def _argument_usage(param: click.Parameter) -> str:
    name = (param.name or "arg").upper()
    name += "..." if param.nargs == -1 else ""
    return name if param.required else f"[{name}]"
