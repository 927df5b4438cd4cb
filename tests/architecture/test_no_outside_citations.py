"""Nothing in the repository cites a document that is not in it: the reasons live in docs/decisions/ and the
docs, so a reader can follow every reference. A citation is a design or seed document named by section ("§4.9.5",
"DESIGN §8"), by its file ("research/…", "…_anchors") or by a path on a machine; a standard's section (RFC 9110
§5.5) is a public reference and may stay."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CITATION = re.compile(
    r"\bseed 00\d|\bseed §|\bDESIGN\b|(?<!RFC \d{4} )(?<!RFC \d{3} )§|\bresearch/|[a-z]+_anchors\b|/work/shared/"
    r"|\bBENCHMARKS\.md\b"
)
#: files whose text names the pattern itself (a check that help texts carry no citation)
PATTERN_FILES = {"tests/architecture/test_no_outside_citations.py", "tests/cli/test_conventions.py"}


def _tracked() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py", "*.md", "*.toml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted({path for path in out.splitlines() if path not in PATTERN_FILES and (REPO / path).is_file()})


def citations(text: str) -> list[tuple[int, str]]:
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1) if CITATION.search(line)]


def test_no_file_cites_a_document_outside_the_repository() -> None:
    found = [
        f"{path}:{n}: {line[:160]}"
        for path in _tracked()
        for n, line in citations((REPO / path).read_text(encoding="utf-8", errors="replace"))
    ]
    assert not found, (
        f"{len(found)} citation(s) of documents not in the repository; say it in our own words or point at "
        "docs/decisions/:\n" + "\n".join(found[:50])
    )


def test_the_pattern_tells_a_citation_from_a_standard() -> None:
    assert citations("settle by the bill (seed 000 §4.9.5)")
    assert citations("the simulated vendor (DESIGN §8)")
    assert citations("29 % of the CPU (research/performance_profile.md)")
    assert citations("numbers from reliability_anchors")
    assert not citations("optional whitespace (RFC 9110 §5.5) and a seed of the fault dice")
