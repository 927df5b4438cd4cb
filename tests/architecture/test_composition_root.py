"""`bootstrap.py` is the only place services are built (issue 11): shells and adapters take them from the
`AppContext`, so each process holds one of each, wired to the same engine, store, slots and notifier.

A *service class* is a class in `aivedio_engine/services/` whose constructor takes dependencies: one with its own
`__init__`, or a dataclass holding an `Engine`. Records, requests and errors (dataclasses without an engine,
exceptions) are values anyone may build. Inside `services/` a service may build the helpers it owns (an
`AfterCommit` per transaction), never a service the context wires. Checked statically, so a construction inside
a function counts too.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVICES = "aivedio_engine.services"
PRODUCT_PACKAGES = ("aivedio_engine", "aivedio_cli", "tui")


def _exceptions(trees: list[ast.Module]) -> set[str]:
    """Names of the exception classes the services define: a builtin exception among their bases, or a class of
    theirs that is one (services/errors.py's hierarchy, and the errors deriving from it elsewhere)."""
    bases = {
        node.name: {b.id for b in node.bases if isinstance(b, ast.Name)}
        for tree in trees
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }
    builtin_errors = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    errors = {n for n, bs in bases.items() if bs & builtin_errors}
    while grown := {n for n, bs in bases.items() if bs & errors} - errors:
        errors |= grown
    return errors


def _holds_engine(node: ast.ClassDef) -> bool:
    return any(isinstance(item, ast.AnnAssign) and "Engine" in ast.unparse(item.annotation) for item in node.body)


def service_classes(root: Path = REPO) -> dict[str, set[str]]:
    """Module (dotted) → names of the service classes it defines."""
    found: dict[str, set[str]] = {}
    paths = sorted((root / "aivedio_engine" / "services").glob("*.py"))
    trees = [ast.parse(path.read_text()) for path in paths]
    errors = _exceptions(trees)
    for path, tree in zip(paths, trees, strict=True):
        for node in tree.body:
            if not isinstance(node, ast.ClassDef) or node.name in errors:
                continue
            has_init = any(isinstance(f, ast.FunctionDef) and f.name == "__init__" for f in node.body)
            if has_init or _holds_engine(node):
                found.setdefault(f"{SERVICES}.{path.stem}", set()).add(node.name)
    return found


def constructions(path: Path, classes: dict[str, set[str]]) -> Iterator[tuple[int, str]]:
    """(line, class) of every call in `path` that builds a service class: `C(...)` after `from <module> import C`
    (aliases too), `m.C(...)` after `import <module> as m` or `from aivedio_engine.services import m`, and
    `aivedio_engine.services.m.C(...)`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: dict[str, str] = {}  # local name → class
    modules: dict[str, str] = {}  # local name or dotted path → service module
    for module in classes:
        modules[module] = module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if node.module in classes and alias.name in classes[node.module]:
                    names[alias.asname or alias.name] = alias.name
                elif node.module == SERVICES and f"{SERVICES}.{alias.name}" in classes:
                    modules[alias.asname or alias.name] = f"{SERVICES}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in classes and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in names:
            yield node.lineno, names[func.id]
        elif isinstance(func, ast.Attribute):
            owner = modules.get(ast.unparse(func.value))
            if owner is not None and func.attr in classes[owner]:
                yield node.lineno, func.attr


def _product_files(root: Path) -> Iterator[Path]:
    for package in PRODUCT_PACKAGES:
        yield from sorted((root / package).rglob("*.py"))


def violations(root: Path = REPO) -> list[str]:
    """Service constructions outside the composition root. Inside `services/`, a service may build the helpers it
    owns (an `AfterCommit` per transaction, an `EventTail` per follower), but not a service the context wires:
    those it receives."""
    classes = service_classes(root)
    bootstrap = root / "aivedio_engine" / "bootstrap.py"
    wired = {cls for _, cls in constructions(bootstrap, classes)}
    services_dir = root / "aivedio_engine" / "services"
    found = []
    for path in _product_files(root):
        if path == bootstrap:
            continue
        in_services = services_dir in path.parents
        for line, cls in constructions(path, classes):
            if not in_services or cls in wired:
                found.append(f"{path.relative_to(root)}:{line} builds {cls}")
    return found


def test_services_are_built_only_in_bootstrap() -> None:
    assert violations() == []


def test_the_context_builds_the_services_the_shells_use() -> None:
    """The check would pass vacuously if it recognised no service classes or none of bootstrap's constructions."""
    classes = service_classes()
    wired = {cls for _, cls in constructions(REPO / "aivedio_engine" / "bootstrap.py", classes)}
    assert {"TaskOps", "ReviewService", "GenerationService", "HeartbeatWriter", "InvariantService"} <= wired
    assert "Operation" not in classes.get(f"{SERVICES}.operations", set())  # a value, built by every shell


@pytest.mark.parametrize(
    "source",
    [
        "from aivedio_engine.services.task_ops import TaskOps\nTaskOps(engine, clock)",
        "from aivedio_engine.services.task_ops import TaskOps as T\ndef f():\n    return T(engine, clock)",
        "from aivedio_engine.services import task_ops\ntask_ops.TaskOps(engine, clock)",
        "import aivedio_engine.services.task_ops as t\nt.TaskOps(engine, clock)",
        "import aivedio_engine.services.task_ops\naivedio_engine.services.task_ops.TaskOps(engine, clock)",
        "def f():\n    from aivedio_engine.services.liveness import HeartbeatWriter\n    HeartbeatWriter(e, c, s, r)",
    ],
)
def test_the_scan_sees_every_construction_form(source: str, tmp_path: Path) -> None:
    for name in ("task_ops.py", "liveness.py"):
        target = tmp_path / "aivedio_engine" / "services" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((REPO / "aivedio_engine" / "services" / name).read_text())
    (tmp_path / "aivedio_engine" / "bootstrap.py").write_text("")
    stray = tmp_path / "tui" / "stray.py"
    stray.parent.mkdir(parents=True)
    stray.write_text(source + "\n")
    assert len(violations(tmp_path)) == 1, violations(tmp_path)


def test_values_and_errors_are_not_services(tmp_path: Path) -> None:
    stray = tmp_path / "aivedio_cli" / "stray.py"
    stray.parent.mkdir(parents=True)
    stray.write_text(
        "from aivedio_engine.services.operations import Operation\n"
        "from aivedio_engine.services.errors import NotFound\n"
        "Operation(command='x', reason=None, dry_run=True)\nraise NotFound('x')\n"
    )
    assert list(constructions(stray, service_classes())) == []


def test_a_service_may_not_build_a_wired_service(tmp_path: Path) -> None:
    services = tmp_path / "aivedio_engine" / "services"
    services.mkdir(parents=True)
    for name in ("task_ops.py", "after_commit.py"):
        (services / name).write_text((REPO / "aivedio_engine" / "services" / name).read_text())
    (tmp_path / "aivedio_engine" / "bootstrap.py").write_text(
        "from aivedio_engine.services.task_ops import TaskOps\nTaskOps(e, c)\n"
    )
    (services / "other.py").write_text(
        "from aivedio_engine.services.after_commit import AfterCommit\n"
        "from aivedio_engine.services.task_ops import TaskOps\n"
        "AfterCommit(e)\nTaskOps(e, c)\n"
    )
    assert violations(tmp_path) == ["aivedio_engine/services/other.py:4 builds TaskOps"]
