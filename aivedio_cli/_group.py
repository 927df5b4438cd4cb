"""The root command group: commands imported only when they run, and one error convention for all of them.

Lazy commands. `aivedio --help` and every Tab press of shell completion start a Python process that builds the
root group; importing every command module there (each pulling in SQLAlchemy, the services, pydantic, …) made
them take 1.5–2.7 s. So the root group knows each command only by a `LazyCommand` line — its name, where it is
defined, and the one line `aivedio --help` shows — and imports the module when the command is resolved to run
(or to show its own help, or to complete its options). Click's "lazy loading subcommands" pattern, adapted to
Typer's group class.

Errors. Whatever goes wrong — a usage mistake Click finds, a `fail()` in a command, an OSError, a bug — the user
gets one line on stderr (`error: …`) and an exit code: 2 usage, 1 failed, 130 interrupted (see `_render`); under
`--json` also a JSON object on stdout. Never a traceback, unless AIVEDIO_TRACEBACK=1 asks for one.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import typer
from typer import _click as click
from typer._click import exceptions as click_errors
from typer.core import TyperCommand, TyperGroup

from aivedio_cli import _render, _typer_fast
from aivedio_cli._render import ExitCode

_typer_fast.install()


@dataclass(frozen=True)
class LazyCommand:
    """One command of `aivedio`: `target` is "module:attribute", a `typer.Typer` (a group of commands) or a
    function (one command); `help` is the line `aivedio --help` lists (a test checks it matches the module's)."""

    name: str
    target: str
    help: str

    def load(self) -> click.Command:
        module_name, _, attribute = self.target.partition(":")
        obj = getattr(importlib.import_module(module_name), attribute)
        if isinstance(obj, typer.Typer):
            command: click.Command = typer.main.get_group(obj)
        else:
            single = typer.Typer(add_completion=False)
            single.command(self.name)(obj)
            command = typer.main.get_command(single)
        command.name = self.name
        return command


class _Listed(TyperCommand):
    """What help and name completion see of a command that was not imported: its name and its one line."""

    def __init__(self, spec: LazyCommand) -> None:
        super().__init__(spec.name, help=spec.help, short_help=spec.help)
        self.spec = spec


class LazyGroup(TyperGroup):
    """A Typer group whose subclass lists `lazy_commands`; see the module docstring."""

    lazy_commands: Sequence[LazyCommand] = ()

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for spec in self.lazy_commands:
            self.commands.setdefault(spec.name, _Listed(spec))

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if isinstance(command, _Listed) and name is not None:
            command = self.commands[name] = command.spec.load()
        return name, command, rest

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # commands that follow work say more themselves (and exit 130 on their own)
            _render.fail("interrupted", ExitCode.INTERRUPTED, "interrupted")

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        _render.begin_invocation(as_json="--json" in argv)
        try:
            result = super().main(
                argv, prog_name, complete_var, standalone_mode=False, windows_expand_args=windows_expand_args, **extra
            )
            code = result if isinstance(result, int) else 0
        except click_errors.NoArgsIsHelpError as exc:
            message = exc.format_message()
            if message:  # without Rich the help is the message; with Rich it was printed already
                print(message, file=sys.stderr)
            code = int(ExitCode.USAGE)
        except click_errors.UsageError as exc:
            hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
            code = _render.report_error(exc.format_message() + hint, ExitCode.USAGE, "usage")
        except click_errors.ClickException as exc:
            code = _render.report_error(exc.format_message(), exc.exit_code, "failed")
        except typer.Abort:
            code = _render.report_error("aborted", ExitCode.FAILED, "aborted")
        except KeyboardInterrupt:  # Typer turns one inside a command into exit 130; this is one outside it
            code = _render.report_error("interrupted", ExitCode.INTERRUPTED, "interrupted")
        except OSError as exc:
            what = f"{exc.strerror}: {exc.filename}" if exc.strerror and exc.filename else str(exc.strerror or exc)
            code = _render.report_error(what, ExitCode.FAILED, "os_error")
        except Exception as exc:  # noqa: BLE001 - the convention: one line, never a traceback by default
            if os.environ.get("AIVEDIO_TRACEBACK"):
                traceback.print_exc()
            code = _render.report_error(
                f"unexpected {type(exc).__name__}: {exc} (AIVEDIO_TRACEBACK=1 prints where)",
                ExitCode.FAILED,
                "internal",
            )
        if standalone_mode:
            sys.exit(code)
        return code
