"""`bench/run NAME --record` keeps a run's headline figures with its date, commit and machine in latest.json, and
docs/benchmarks.md shows them: the figures are read from the benchmark's own JSON document, a figure the document
lacks is null (shown "—"), and a failed run records nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import __main__ as bench_main
from bench import headlines
from docsgen import benchmarks as page


@pytest.fixture(autouse=True)
def _a_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit a run was made at, as git would say (a copy of the code may not be a git checkout)."""
    monkeypatch.setattr(headlines.common, "git_info", lambda: {"commit": "0123456789abcdef", "dirty": False})


def _cli_doc(help_s: float, completion_s: float) -> dict[str, Any]:
    return {
        "cases": {
            "aivedio --help": {"median_s": help_s},
            "complete: aivedio ta<TAB>": {"median_s": completion_s},
            "complete: aivedio generate --model <TAB>": {"median_s": completion_s / 2},
        }
    }


def test_a_recorded_run_keeps_its_figures_date_commit_and_machine(tmp_path: Path) -> None:
    latest = tmp_path / "latest.json"
    headlines.record("cli_start", _cli_doc(0.12, 0.4), "bench/run cli_start --record", latest)
    entry = json.loads(latest.read_text())["benchmarks"]["cli_start"]
    assert entry["figures"] == {"help_median_s": 0.12, "slowest_completion_median_s": 0.4}
    assert entry["recorded"].endswith("Z") and entry["commit"] == "0123456"
    assert entry["machine"]["nproc"] >= 1 and "hostname" not in entry["machine"]
    assert entry["command"] == "bench/run cli_start --record"


def test_recording_one_benchmark_keeps_the_others(tmp_path: Path) -> None:
    latest = tmp_path / "latest.json"
    headlines.record("memory_inflight", {"ratio": 2.0}, "x", latest)
    headlines.record("cli_start", _cli_doc(0.1, 0.2), "y", latest)
    headlines.record("memory_inflight", {"ratio": 1.5}, "z", latest)
    doc = json.loads(latest.read_text())["benchmarks"]
    assert doc["memory_inflight"]["figures"] == {"ratio": 1.5}
    assert doc["cli_start"]["figures"]["help_median_s"] == 0.1


def test_a_figure_the_document_lacks_is_null_not_guessed() -> None:
    assert headlines.figures("relay", {"ratio": 0.5}) == {"relay_vs_slower_part": 0.5, "relay_vs_api_create": None}
    assert headlines.figures("broker_hop", {"results": [{"kind": "redis", "p50_ms": 18.0}]})["rabbitmq_p50_ms"] is None


def test_every_headline_names_a_benchmark_that_exists() -> None:
    assert set(headlines.HEADLINES) <= set(bench_main.BENCHMARKS)


def test_the_page_shows_the_recorded_value_date_and_commit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    latest = tmp_path / "latest.json"
    headlines.record("memory_inflight", {"ratio": 1.234}, "bench/run memory_inflight --record", latest)
    entry = json.loads(latest.read_text())["benchmarks"]["memory_inflight"]
    monkeypatch.setattr(headlines, "LATEST", latest)
    text = page.render()
    figures = text.split("## Latest figures", 1)[1]
    row = next(line for line in figures.splitlines() if line.startswith("| `memory_inflight` |"))
    assert f"| 1.23 | {entry['recorded'][:10]} | `{entry['commit']}` |" in row
    assert "| `api_create` | API creates ÷ our own create transaction, 1 tenant | ≥ 0.6 | not recorded |" in text


def test_record_through_the_command_line_and_a_failed_run_records_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    latest = tmp_path / "latest.json"
    monkeypatch.setattr(headlines, "LATEST", latest)
    monkeypatch.setattr(headlines.common, "REPO", tmp_path)

    def fake_run(code: int) -> Any:
        def run(args: Any) -> int:
            Path(args.json_out).write_text(json.dumps(_cli_doc(0.2, 0.3)))
            return code

        return run

    from bench import cli_start

    monkeypatch.setattr(cli_start, "run", fake_run(1))
    out = tmp_path / "run.json"
    assert bench_main.main(["cli_start", "--record", "--json-out", str(out)]) == 1
    assert not latest.exists()
    monkeypatch.setattr(cli_start, "run", fake_run(0))
    assert bench_main.main(["cli_start", "--record", "--json-out", str(out)]) == 0
    figures = json.loads(latest.read_text())["benchmarks"]["cli_start"]["figures"]
    assert figures == {"help_median_s": 0.2, "slowest_completion_median_s": 0.3}
