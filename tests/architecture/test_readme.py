"""The README is an entry point a new user can follow: short, every link leads to a file of the repository, no
measurement in it (figures live in docs/benchmarks.md), and the commands it shows exist with the options shown —
the quick start's two scripts parse, and each command of the tour is run with `--help` appended, which still
refuses an unknown command or option. tests/cli/test_readme_quickstart.py runs the quick start itself."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
AIVEDIO = Path(sys.executable).with_name("aivedio")

#: a number with a unit of time, size, rate or share: a measurement, which belongs in docs/benchmarks.md
MEASUREMENT = re.compile(
    r"\b\d[\d.,]*\s*(?:ms|µs|s|KiB|MiB|GiB|KB|MB|%|TPS|(?:tasks|events|creates|requests|frames)/s)(?![\w/])"
    r"|\bp(?:50|90|99)\b"
)


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    _, found, rest = text.partition(f"\n## {title}\n")
    assert found, f"README has no section {title!r}"
    return rest.split("\n## ", 1)[0]


def _commands(section: str) -> list[str]:
    """The lines of the section's first ```bash block, comments dropped."""
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the section has no ```bash block"
    return [line.split(" #", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_is_short_and_measures_nothing() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 120, f"README.md has {len(lines)} lines; keep it to 120 (details go to docs/)"
    found = [f"{n}: {line.strip()}" for n, line in enumerate(lines, 1) if MEASUREMENT.search(line)]
    assert not found, "measurements belong in docs/benchmarks.md (bench/results/latest.json):\n" + "\n".join(found)


def test_the_measurement_pattern_catches_a_figure() -> None:
    assert MEASUREMENT.search("a message reaches an idle worker in ~2 ms")
    assert MEASUREMENT.search("1,572 creates/s at p99")
    assert not MEASUREMENT.search("Python ≥ 3.11, `--port 8000`, redis://redis:6379/0")


def test_every_relative_link_of_the_readme_exists() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    relative = [link for link in links if "://" not in link]
    assert relative, "the README links no document"
    missing = [link for link in relative if not (REPO / link).exists()]
    assert not missing, f"README links missing files: {missing}"


def test_the_quick_start_commands_are_the_two_scripts_and_they_parse() -> None:
    commands = _commands(_section("Quick start"))
    assert commands == ["bash scripts/quickstart", "bash scripts/test"]
    for command in commands:
        script = REPO / command.split()[1]
        res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert res.returncode == 0, f"{command}: {res.stderr}"


def _tour() -> list[list[str]]:
    return [shlex.split(line) for line in _commands(_section("A tour in ten lines"))]


def test_the_tour_has_ten_lines_that_start_with_activating_the_venv() -> None:
    tour = _tour()
    assert len(tour) == 10
    assert tour[0] == ["source", ".venv/bin/activate"]
    assert all(argv[0] == "aivedio" for argv in tour[1:])


@pytest.mark.parametrize("argv", _tour()[1:], ids=lambda argv: " ".join(argv[:3]))
def test_each_command_of_the_tour_exists_with_the_options_shown(argv: list[str]) -> None:
    res = subprocess.run([str(AIVEDIO), *argv[1:], "--help"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, f"{' '.join(argv)}: {res.stderr or res.stdout}"
    assert "Usage: aivedio" in res.stdout


def test_an_unknown_option_in_the_tour_would_be_caught() -> None:
    res = subprocess.run([str(AIVEDIO), "generate", "x", "--no-such-option", "--help"], capture_output=True, text=True)
    assert res.returncode != 0
