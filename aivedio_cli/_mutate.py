"""Conventions of every mutating command: `--dry-run`, `--yes`, `--reason`,
never a prompt without a TTY, and for bulk commands the exact previewed set saved with `--plan-out F` and
applied with `--plan F`.

A plan file is JSON: the command, the filters it was made with, the ids, and a digest over them; applying it to
another command, or after editing the ids by hand without updating the digest, is refused.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from aivedio_cli._render import ExitCode, fail

if TYPE_CHECKING:  # loads the database tables: imported when a command runs, not when completion loads it
    from aivedio_engine.services.operations import Operation

PLAN_VERSION = 1

DRY_RUN = typer.Option(False, "--dry-run", help="Show what would change; change nothing (still audited).")
YES = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation (required without a terminal).")
REASON = typer.Option(None, "--reason", help="Why: stored in the audit log (required unless --dry-run).")
PLAN_OUT = typer.Option(None, "--plan-out", help="Save exactly the previewed set to this file (implies --dry-run).")
PLAN = typer.Option(None, "--plan", help="Apply exactly the set saved by --plan-out, ignoring filters.")


def operation(command: str, reason: str | None, dry_run: bool, **args: Any) -> Operation:
    from aivedio_engine.services.operations import Operation

    op = Operation(command=command, reason=reason, dry_run=dry_run, args=args)
    if not dry_run and not (reason or "").strip():
        fail(f"{command}: --reason is required (it is stored in the audit log)", ExitCode.USAGE)
    return op


def confirm(question: str, yes: bool) -> None:
    """Ask unless --yes; without a terminal, refuse instead of waiting for an answer nobody can give."""
    if yes:
        return
    if not sys.stdin.isatty():
        fail(f"{question} — refusing without a terminal: pass --yes to confirm", ExitCode.REFUSED)
    if not typer.confirm(question, default=False, err=True):
        fail("not confirmed; nothing changed", ExitCode.REFUSED)


def _digest(command: str, ids: Sequence[str]) -> str:
    return hashlib.sha256("\n".join([command, *ids]).encode()).hexdigest()


def write_plan(path: Path, command: str, ids: Sequence[str], filters: dict[str, Any]) -> None:
    ids = [str(i) for i in ids]
    doc = {
        "version": PLAN_VERSION,
        "command": command,
        "created_at": datetime.now(UTC).isoformat(),
        "filters": {k: (str(v) if v is not None else None) for k, v in filters.items()},
        "count": len(ids),
        "ids": ids,
        "digest": _digest(command, ids),
    }
    try:
        path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write plan {path}: {exc.strerror or exc}")


def read_plan(path: Path, command: str) -> list[str]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        fail(f"cannot read plan {path}: {exc.strerror or exc}", ExitCode.USAGE)
    except ValueError:
        fail(f"{path} is not a plan file (not JSON)", ExitCode.USAGE)
    if not isinstance(doc, dict) or doc.get("version") != PLAN_VERSION or not isinstance(doc.get("ids"), list):
        fail(f"{path} is not a plan file of this version", ExitCode.USAGE)
    if doc.get("command") != command:
        fail(f"{path} is a plan for `{doc.get('command')}`, not `{command}`", ExitCode.REFUSED)
    ids = [str(i) for i in doc["ids"]]
    if doc.get("digest") != _digest(command, ids):
        fail(f"{path} was changed after it was written (digest mismatch)", ExitCode.REFUSED)
    return ids
