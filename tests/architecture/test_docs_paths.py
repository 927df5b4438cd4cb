"""The path of one task in docs/architecture.md names the module of each step; every module it names exists, so the
doc cannot keep describing code that moved or was removed. Paths are relative to aivedio_engine/ (the engine's
package) unless they start with a top-level directory of the repository."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "architecture.md"
PACKAGE = REPO / "aivedio_engine"
#: a module path as the doc writes it: `services/submit.py`, `db/creation.py`, `worker/relay.py`
MODULE = re.compile(r"(?<![\w./-])((?:[a-z_]+/)+[a-z_]+\.py)\b")


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## [\w.]* ?{re.escape(title)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, f"docs/architecture.md has no section {title!r}"
    return match.group(1)


def _exists(path: str) -> bool:
    return (PACKAGE / path).is_file() or (REPO / path).is_file()


def modules_named(text: str) -> list[str]:
    return sorted(set(MODULE.findall(text)))


def test_every_module_on_the_path_of_one_task_exists() -> None:
    named = modules_named(_section(ARCHITECTURE.read_text(encoding="utf-8"), "The path of one task"))
    assert len(named) >= 10, f"the path of one task names too few modules: {named}"
    missing = [path for path in named if not _exists(path)]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_a_moved_module_would_be_caught() -> None:
    named = modules_named("the submit (services/submit.py) and the old relay (services/no_such_relay.py)")
    assert named == ["services/no_such_relay.py", "services/submit.py"]
    assert [path for path in named if not _exists(path)] == ["services/no_such_relay.py"]
