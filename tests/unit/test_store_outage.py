"""`services.store_outage.watched`: which store failures page the on-call engineer, and that the step's own
failure always propagates unchanged — also when the alert itself cannot be written."""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from aivedio_engine.fetch.fetcher import FetchError
from aivedio_engine.services import store_outage
from aivedio_engine.storage.base import ObjectNotFound, ObjectTooLarge

STORE: Any = SimpleNamespace(kind="s3", bucket="media")
CLOCK: Any = SimpleNamespace(now=lambda: datetime(2026, 12, 7, tzinfo=UTC))


class _Engine:
    """Records the transactions it was asked for; `down` makes `begin` fail as an unreachable database would."""

    def __init__(self, down: bool = False) -> None:
        self.down = down
        self.begun = 0

    @contextmanager
    def begin(self) -> Any:
        self.begun += 1
        if self.down:
            raise ConnectionError("database down")
        yield SimpleNamespace()


@pytest.fixture
def raised(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(
        store_outage.alerts, "raise_alert", lambda conn, rule, sev, **kw: calls.append(kw | {"rule": rule})
    )
    return calls


def _watch(engine: Any, exc: Exception, answers: tuple[type[Exception], ...] = ()) -> None:
    with store_outage.watched(engine, CLOCK, STORE, step="fetch", task_id=uuid.UUID(int=7), answers=answers):
        raise exc


@pytest.mark.parametrize(
    ("exc", "answers"),
    [
        (ObjectNotFound("k"), ()),
        (ObjectTooLarge("k"), ()),
        (FetchError("truncated", "got 1 of 2 bytes"), (FetchError,)),
    ],
)
def test_answers_of_a_working_store_and_the_callers_own_errors_raise_no_alert(
    raised: list[dict[str, Any]], exc: Exception, answers: tuple[type[Exception], ...]
) -> None:
    engine = _Engine()
    with pytest.raises(type(exc)):
        _watch(engine, exc, answers)
    assert raised == [] and engine.begun == 0


def test_a_store_failure_raises_one_alert_keyed_by_the_store_and_propagates(raised: list[dict[str, Any]]) -> None:
    with pytest.raises(TimeoutError, match="connect timed out"):
        _watch(_Engine(), TimeoutError("connect timed out"))
    (alert,) = raised
    assert alert["rule"] == store_outage.alerts.Rule.STORAGE_UNAVAILABLE
    assert alert["dedup_key"] == "s3:media" and alert["subject_id"] == "s3 media"
    assert alert["details"] == {
        "step": "fetch",
        "task_id": str(uuid.UUID(int=7)),
        "error": "TimeoutError: connect timed out",
    }


def test_the_steps_failure_propagates_when_the_alert_cannot_be_written(raised: list[dict[str, Any]]) -> None:
    engine = _Engine(down=True)
    with pytest.raises(OSError, match="bucket gone"):
        _watch(engine, OSError("bucket gone"))
    assert engine.begun == 1 and raised == []
