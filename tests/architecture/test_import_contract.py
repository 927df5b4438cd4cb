"""The persistence layer's import contract (issue 11): only `aivedio_engine/db/` builds SQL. Every other module of
the engine, the CLI and the TUI imports neither SQLAlchemy nor the table definitions; what it may hold of the
database (engine, connection, errors) comes from `aivedio_engine.db.handles`. No exceptions are listed: the last
modules that built SQL themselves (sweeper, sync, reducer, dispatch, submit, ...) moved it into db/."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ["aivedio_engine", "aivedio_cli", "tui"]
PERSISTENCE = REPO / "aivedio_engine" / "db"


def _forbidden(name: str) -> bool:
    return name == "sqlalchemy" or name.startswith("sqlalchemy.") or name == "aivedio_engine.db.tables"


def _violations(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _forbidden(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _forbidden(node.module):
                found.append(node.module)
            elif node.module == "aivedio_engine.db" and any(a.name == "tables" for a in node.names):
                found.append("aivedio_engine.db.tables")
    return found


def _modules() -> dict[str, list[str]]:
    result = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            if PERSISTENCE in path.parents:
                continue
            result[str(path.relative_to(REPO))] = _violations(path)
    return result


def test_only_the_persistence_layer_imports_sqlalchemy_or_the_tables() -> None:
    offenders = {m: v for m, v in _modules().items() if v}
    assert not offenders, f"move this SQL into aivedio_engine/db/ (or import from db.handles): {offenders}"
