"""`jobs.follow`: every transition is reported once, also those between two polls when the client can read the
history; a client without history reports what each poll sees."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from aivedio_engine.client import ClientError, Snapshot
from aivedio_engine.jobs import follow, parse_batch

PATH = ["QUEUED", "DISPATCHING", "SUBMITTED", "OUTPUT_FETCHING", "POST_PROCESSING", "SUCCEEDED"]


class _Client:
    """The task finishes between the first and the second poll."""

    def __init__(self) -> None:
        self.polls = 0

    def get(self, task_id: str) -> Snapshot:
        self.polls += 1
        return Snapshot(task_id, "SUCCEEDED", 9, 100)


class _HistoryClient(_Client):
    def changes(self, task_id: str, after_version: int) -> list[Snapshot]:
        return [
            Snapshot(task_id, s, v, 100 if s == "SUCCEEDED" else 0)
            for v, s in enumerate(PATH, start=4)
            if v > after_version
        ]


class _Stop(threading.Event):
    def wait(self, timeout: float | None = None) -> bool:  # no real sleeping in a unit test
        return False


def test_history_client_reports_every_transition_once() -> None:
    seen: list[str] = []
    final = follow(
        _HistoryClient(), Snapshot("t", "QUEUED", 4, 0), lambda s: seen.append(s.status), timeout_s=5, stop=_Stop()
    )
    assert seen == PATH and final.status == "SUCCEEDED"


def test_polling_client_reports_what_it_sees() -> None:
    seen: list[str] = []
    client = _Client()
    follow(client, Snapshot("t", "QUEUED", 4, 0), lambda s: seen.append(s.status), timeout_s=5, stop=_Stop())
    assert seen == ["QUEUED", "SUCCEEDED"] and client.polls == 1


@pytest.mark.parametrize(
    "line", ['{"prompt": "a fox"', '{"prompt": "a fox", "seed": ' + "1" * 5000 + "}"], ids=["truncated", "huge-integer"]
)
def test_a_line_that_is_not_json_is_a_client_error(tmp_path: Path, line: str) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"prompt": "a cat"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ClientError, match=r"batch.jsonl:2: not JSON"):
        parse_batch(batch)


def test_a_batch_line_may_ask_for_n_outputs(tmp_path: Path) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"prompt": "a cat", "n": 3}\n{"prompt": "a dog"}\n', encoding="utf-8")
    three, one = parse_batch(batch)
    assert three.options == {"n": 3} and one.options == {}
