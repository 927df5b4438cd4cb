"""The query step's retry budget (`[retry.query]`) applied to polling: consecutive failed queries of one job back
off by the budget, and a spent budget raises an alert (the task is not failed: see `domain.polling`).

The streak (how many queries failed in a row, since when) is kept on the attempt in `provider_error_code`, the
way a rate-limited submit keeps its Retry-After there (`provider_health.error_code_with_retry_after`): the column
is otherwise empty while a job is being polled, any poller process can read it, and a successful query clears it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aivedio_engine.db import alerts
from aivedio_engine.db.handles import Connection
from aivedio_engine.domain.polling import PollPolicy, after_query_failure
from aivedio_engine.domain.retry import RetryBudget
from aivedio_engine.domain.status import AlertSeverity

_STREAK = re.compile(r"query_failed;n=(\d+);since=(\d+)")


@dataclass(frozen=True, slots=True)
class Streak:
    failures: int
    since: datetime

    def code(self) -> str:
        return f"query_failed;n={self.failures};since={int(self.since.timestamp())}"


def streak_of(code: str | None) -> Streak | None:
    match = _STREAK.fullmatch(code or "")
    if match is None:
        return None
    return Streak(int(match.group(1)), datetime.fromtimestamp(int(match.group(2)), UTC))


@dataclass(frozen=True, slots=True)
class FailedQuery:
    next_poll_at: datetime
    code: str
    #: the budget is spent: why (for the alert), else None
    spent: str | None


def after_failure(
    policy: PollPolicy,
    budget: RetryBudget,
    code: str | None,
    *,
    submitted_at: datetime | None,
    deadline_at: datetime | None,
    now: datetime,
    rng: random.Random,
) -> FailedQuery:
    """The attempt's next poll and its new streak code after one more failed query."""
    prev = streak_of(code)
    streak = Streak(prev.failures + 1, prev.since) if prev else Streak(1, now)
    retry = after_query_failure(
        policy,
        budget,
        failures=streak.failures,
        first_failure_at=streak.since,
        submitted_at=submitted_at or now,
        now=now,
        rng=rng,
        task_deadline_at=deadline_at,
    )
    return FailedQuery(retry.at, streak.code(), retry.spent)


def alert_spent(conn: Connection, row: Any, failed: FailedQuery, now: datetime) -> None:
    """One open alert per attempt while its queries keep failing past the budget."""
    alerts.raise_alert(
        conn,
        alerts.Rule.QUERY_BUDGET_SPENT,
        AlertSeverity.WARNING,
        dedup_key=str(row.id),
        now=now,
        subject_type="attempt",
        subject_id=str(row.id),
        message=f"queries of {row.provider} job {row.provider_job_id} keep failing ({failed.spent}); "
        "still polling at the slowest interval, a callback can still finish the task",
    )
