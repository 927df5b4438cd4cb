"""The generated parts of docs/: the HTTP API, CLI and configuration references, made from the code itself, and
the benchmarks page, made from bench/results/latest.json.

Each reference file keeps its hand-written prose; only the part between the BEGIN and END markers below is
generated, so prose can be edited in place and the reference can never drift from the code: `python -m docsgen`
(or `bash scripts/gen-docs`) rewrites those parts, and `python -m docsgen --check` — which
tests/architecture/test_docs_current.py runs — fails naming every stale file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REFRESH = "bash scripts/gen-docs"
BEGIN = f"<!-- BEGIN GENERATED: do not edit by hand; `{REFRESH}` rewrites this part -->"
END = "<!-- END GENERATED -->"


class DocsError(Exception):
    """A reference cannot be generated (markers missing, an example naming no operation, ...)."""


def _renderers() -> dict[str, Callable[[], str]]:
    # imported here: each renderer pulls in its part of the application (FastAPI, Typer, the settings model)
    from docsgen import api, benchmarks, cli, configuration

    return {
        "docs/api.md": api.render,
        "docs/benchmarks.md": benchmarks.render,
        "docs/cli.md": cli.render,
        "docs/configuration.md": configuration.render,
    }


def splice(document: str, generated: str, name: str) -> str:
    """`document` with the text between its markers replaced by `generated`."""
    head, begin, rest = document.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise DocsError(f"{name}: the markers are missing; put {BEGIN!r} and {END!r} where the reference goes")
    return f"{head}{BEGIN}\n{generated.strip()}\n{END}{tail}"


def refreshed() -> dict[Path, tuple[str, str]]:
    """Every generated file: (text on disk, text it should have)."""
    out = {}
    for name, render in _renderers().items():
        path = REPO / name
        current = path.read_text(encoding="utf-8")
        out[path] = (current, splice(current, render(), name))
    return out


def stale() -> list[str]:
    """Files whose generated part differs from what the code says now (relative paths)."""
    return [str(path.relative_to(REPO)) for path, (old, new) in refreshed().items() if old != new]


def write() -> list[str]:
    """Rewrite the generated parts; returns the files that changed."""
    changed = []
    for path, (old, new) in refreshed().items():
        if old != new:
            path.write_text(new, encoding="utf-8")
            changed.append(str(path.relative_to(REPO)))
    return changed
