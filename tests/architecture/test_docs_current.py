"""The generated references in docs/ (HTTP API, CLI, configuration, benchmarks) say what the code and
bench/results/latest.json say now: each is rendered again in memory and compared with the file (docsgen/)."""

from __future__ import annotations

import pytest

import docsgen
from docsgen import BEGIN, END, REFRESH, DocsError, refreshed, splice


def test_generated_references_are_current() -> None:
    files = refreshed()
    assert {path.name for path in files} == {"api.md", "benchmarks.md", "cli.md", "configuration.md"}
    stale = [str(path.relative_to(docsgen.REPO)) for path, (old, new) in files.items() if old != new]
    assert not stale, f"stale generated docs: {', '.join(stale)}; refresh them with `{REFRESH}` and commit"


def test_a_hand_edit_of_a_generated_part_is_caught_and_prose_is_kept() -> None:
    document = f"# Title\n\nprose written by hand\n\n{BEGIN}\nthe reference\n{END}\n\nmore prose\n"
    assert splice(document, "the reference", "x.md") == document
    edited = document.replace("the reference", "the reference, edited by hand")
    assert splice(edited, "the reference", "x.md") == document


def test_a_file_without_markers_is_refused() -> None:
    with pytest.raises(DocsError, match="markers are missing"):
        splice("# no markers\n", "the reference", "x.md")


def test_every_curl_example_names_an_operation_of_the_api() -> None:
    from docsgen import api
    from docsgen.api_examples import EXAMPLES

    paths = api.openapi_document()["paths"]
    operations = {f"{method.upper()} {path}" for path, item in paths.items() for method in item}
    assert set(EXAMPLES) <= operations, set(EXAMPLES) - operations
