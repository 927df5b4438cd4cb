"""The dependency locks (requirements/*.txt, made by `bash scripts/lock`) pin every requirement of pyproject.toml
to one version inside its range, with hashes, so scripts/quickstart, scripts/test and CI install exactly them."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
BASE = PYPROJECT["project"]["dependencies"]
TEST = PYPROJECT["project"]["optional-dependencies"]["test"]
BUILD = [line for line in (REPO / "requirements" / "build.in").read_text().splitlines() if line and line[0] != "#"]


def _pins(lock: str) -> dict[str, list[tuple[str, bool]]]:
    """name → [(version, has a hash)], one entry per pinned line (a universal lock may pin per Python version)."""
    text = (REPO / "requirements" / lock).read_text()
    pins: dict[str, list[tuple[str, bool]]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        match = re.match(r"([A-Za-z0-9_.\-\[\]]+)==([^\s;\\]+)", block)
        if match:
            name = canonicalize_name(match.group(1).split("[")[0])
            pins.setdefault(name, []).append((match.group(2), "--hash=sha256:" in block))
    return pins


@pytest.mark.parametrize(
    ("lock", "requirements"),
    [
        ("base.txt", BASE + BUILD),
        ("test.txt", BASE + TEST + BUILD),
    ],
)
def test_lock_pins_every_requirement_inside_its_range_with_hashes(lock: str, requirements: list[str]) -> None:
    pins = _pins(lock)
    assert pins and all(hashed for versions in pins.values() for _, hashed in versions), f"{lock}: a pin has no hash"
    for line in requirements:
        requirement = Requirement(line)
        versions = pins.get(canonicalize_name(requirement.name))
        assert versions, f"{lock} does not pin {requirement.name}: run `bash scripts/lock`"
        for version, _ in versions:
            assert requirement.specifier.contains(version, prereleases=True), (
                f"{lock} pins {requirement.name}=={version}, outside {requirement.specifier}: run `bash scripts/lock`"
            )


def test_both_locks_agree_on_every_shared_package() -> None:
    base, test = _pins("base.txt"), _pins("test.txt")
    differ = {name for name in base if name in test and base[name] != test[name]}
    assert not differ, f"base.txt and test.txt pin different versions of {sorted(differ)}: run `bash scripts/lock`"
