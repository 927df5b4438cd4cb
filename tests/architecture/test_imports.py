"""Layering rules, checked in fresh interpreters so nothing already imported can hide a leak."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ["sqlalchemy", "psycopg", "httpx", "dramatiq", "redis", "boto3", "fastapi", "textual"]


def _loaded_after(code: str) -> set[str]:
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def test_domain_loads_no_io_library() -> None:
    modules = [p.stem for p in (REPO / "aivedio_engine" / "domain").glob("*.py") if p.stem != "__init__"]
    code = "\n".join(f"import aivedio_engine.domain.{m}" for m in modules)
    loaded = _loaded_after("import aivedio_engine.domain\n" + code)
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_cli_does_not_import_textual_at_start_up() -> None:
    loaded = _loaded_after("import aivedio_cli.main")
    assert "textual" not in loaded and "tui" not in loaded


def test_cli_start_up_loads_no_engine_library() -> None:
    """`aivedio --help` and every Tab press import aivedio_cli.main: commands are loaded when they run, so the
    database, HTTP, broker and config stacks stay out (they made start-up take seconds)."""
    loaded = _loaded_after("import aivedio_cli.main")
    assert not loaded & {"sqlalchemy", "fastapi", "dramatiq", "pydantic", "rich", *HEAVY}, loaded & set(HEAVY)


@pytest.mark.parametrize("path", sorted((REPO / "aivedio_engine" / "domain").glob("*.py")), ids=lambda p: p.name)
def test_domain_sources_import_only_stdlib_and_domain(path: Path) -> None:
    """Static check too: a lazy import inside a function would escape the runtime probe."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or name.startswith("aivedio_engine.domain"), (path.name, name)


#: the one sanctioned crossing: `aivedio tui` launches the Textual app (lazily, inside the command)
LAUNCHERS = {(REPO / "aivedio_cli" / "tui_cmd.py", "tui.app")}


def test_front_ends_do_not_import_each_other() -> None:
    rules = {"aivedio_cli": ["tui", "aivedio_engine.api"], "tui": ["aivedio_cli", "aivedio_engine.api"]}
    for package, forbidden in rules.items():
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    mods = [node.module]
                elif isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                else:
                    continue
                for mod in mods:
                    if (path, mod) in LAUNCHERS:
                        continue
                    assert not any(mod == f or mod.startswith(f + ".") for f in forbidden), (path, mod)


#: client-mandated libraries, each kept behind ONE module so it can be swapped (coding rules)
SWAPPABLE = {
    "httpx": REPO / "aivedio_engine" / "httpclient.py",
    "ffmpeg": REPO / "aivedio_engine" / "media" / "ffgraph.py",
}
PRODUCT_PACKAGES = ("aivedio_engine", "aivedio_cli", "tui")


def _imported_tops(path: Path) -> set[str]:
    """Top-level names of every absolute import in `path`, lazy ones inside functions included."""
    tops = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            tops.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return tops


def _importers(library: str, root: Path = REPO) -> set[Path]:
    return {
        path
        for package in PRODUCT_PACKAGES
        for path in (root / package).rglob("*.py")
        if library in _imported_tops(path)
    }


@pytest.mark.parametrize("library", sorted(SWAPPABLE))
def test_swappable_library_is_imported_by_one_module_only(library: str) -> None:
    assert _importers(library) == {SWAPPABLE[library]}


@pytest.mark.parametrize(
    "source",
    [
        "import httpx",
        "import httpx._client as c",
        "from httpx import Client",
        "def f():\n    from httpx._models import Response",
    ],
)
def test_the_import_scan_sees_every_import_form(source: str, tmp_path: Path) -> None:
    stray = tmp_path / "aivedio_engine" / "fetch" / "stray.py"
    stray.parent.mkdir(parents=True)
    stray.write_text(source + "\n")
    assert _importers("httpx", tmp_path) == {stray}


def _product_imports(path: Path) -> set[str]:
    """Every product module `path` imports (lazy imports inside functions included); `from pkg import name` counts
    as `pkg.name`, since the name may be a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in PRODUCT_PACKAGES)
    return found


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


#: the shells: what receives a request, a message or a keystroke, and the one place that wires them
SHELLS = ("aivedio_engine.api", "aivedio_engine.worker", "aivedio_engine.bootstrap", "aivedio_cli", "tui")
#: what the persistence layer may import: the domain and the process's plumbing, and the value types of the adapters'
#: contracts its rows hold (a job status, a request fingerprint, a lease) — never a service, an adapter or a shell
DB_MAY_IMPORT = (
    "aivedio_engine.clock",
    "aivedio_engine.config",
    "aivedio_engine.db",
    "aivedio_engine.domain",
    "aivedio_engine.observability",
    "aivedio_engine.testing",
    "aivedio_engine.providers.base",
    "aivedio_engine.providers.fingerprint",
    "aivedio_engine.slots.base",
)


@pytest.mark.parametrize("path", sorted((REPO / "aivedio_engine" / "services").rglob("*.py")), ids=lambda p: p.name)
def test_services_import_no_shell(path: Path) -> None:
    assert not {m for m in _product_imports(path) if _under(m, SHELLS)}


@pytest.mark.parametrize("path", sorted((REPO / "aivedio_engine" / "db").rglob("*.py")), ids=lambda p: p.name)
def test_the_persistence_layer_imports_nothing_above_the_domain(path: Path) -> None:
    assert not {m for m in _product_imports(path) if not _under(m, DB_MAY_IMPORT)}


def test_the_layer_scan_sees_a_lazy_import_of_a_service(tmp_path: Path) -> None:
    stray = tmp_path / "stray.py"
    stray.write_text("def f():\n    from aivedio_engine.services import reducer\n")
    assert _product_imports(stray) == {"aivedio_engine.services.reducer"}
    assert not _under("aivedio_engine.services.reducer", DB_MAY_IMPORT)
