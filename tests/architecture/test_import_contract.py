"""The persistence layer's import contract (issue 11): only `aivedio_engine/db/` builds SQL. Every other module of
the engine, the CLI and the TUI imports neither SQLAlchemy nor the table definitions; what it may hold of the
database (engine, connection, errors) comes from `aivedio_engine.db.handles`.

`NOT_YET` lists the modules that still build SQL themselves. It only shrinks: a module on it that no longer
needs to be there fails the test too, so the list always says exactly how far the move has come."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ["aivedio_engine", "aivedio_cli", "tui"]
PERSISTENCE = REPO / "aivedio_engine" / "db"

#: modules that still import sqlalchemy or aivedio_engine.db.tables (repo-relative); move their SQL into db/
NOT_YET: set[str] = {
    "aivedio_engine/services/after_commit.py",
    "aivedio_engine/services/consume.py",
    "aivedio_engine/services/dispatch.py",
    "aivedio_engine/services/generations.py",
    "aivedio_engine/services/intake.py",
    "aivedio_engine/services/observations.py",
    "aivedio_engine/services/reducer.py",
    "aivedio_engine/services/reducer_cases.py",
    "aivedio_engine/services/submit.py",
}


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
    offenders = {m: v for m, v in _modules().items() if v and m not in NOT_YET}
    assert not offenders, f"move this SQL into aivedio_engine/db/ (or import from db.handles): {offenders}"


def test_the_not_yet_list_only_names_modules_that_still_need_it() -> None:
    modules = _modules()
    stale = sorted(m for m in NOT_YET if not modules.get(m))
    assert not stale, f"these modules no longer build SQL (or are gone): take them off NOT_YET: {stale}"
