"""A fixed dataset with the read methods of `tui.data.EngineData`, for SVG snapshots.

Seeded databases carry random UUIDv7 ids and wall-clock times, which would change every snapshot; the screens
and widgets that render this data are the real ones, only the data source is swapped.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from aivedio_engine.services.alert_ops import AlertView
from aivedio_engine.services.invariants import AuditReport, CheckResult, Skipped
from aivedio_engine.services.overview import AlertLine, Overview, ProviderLoad, RoleLine
from aivedio_engine.services.review import ReviewView
from aivedio_engine.services.task_ops import TaskRow
from tui.data import AlertQuery, AssetFacts, AuditRun, TaskQuery

NOW = datetime(2026, 3, 14, 9, 26, 53, tzinfo=UTC)
ACME = uuid.UUID("0195a3c0-0000-7000-8000-00000000ac3e")


def _id(n: int) -> uuid.UUID:
    return uuid.UUID(f"0195a3c0-{n:04x}-7000-8000-{n:012x}")


_TASKS = [  # (status, tenant, provider, attempts, progress, minutes ago, note)
    ("MANUAL_REVIEW", "acme", "sim", 1, 100, 2, "media held: prompt matches review term"),
    ("RUNNING", "acme", "runway", 1, 40, 3, ""),
    ("SUBMIT_UNKNOWN", "globex", "sim", 1, 0, 5, ""),
    ("QUEUED", "globex", None, 0, 0, 6, ""),
    ("SUCCEEDED", "acme", "sim", 1, 100, 9, ""),
    ("FAILED_FINAL", "initech", "runway", 3, 0, 14, "provider_rejected"),
    ("RETRY_WAIT", "initech", "sim", 2, 0, 15, "provider_timeout"),
]


_ALERTS = [
    AlertView(
        _id(301),
        "submit_unknown_parked",
        "warning",
        "OPEN",
        "task",
        str(_id(3)),
        "task 0195a3c0-0003 waited 10m for a lookup; parked for a human",
        NOW - timedelta(minutes=4),
        NOW - timedelta(minutes=1),
        None,
        None,
        None,
    ),
    AlertView(
        _id(302),
        "queue_backlog",
        "info",
        "ACKNOWLEDGED",
        None,
        None,
        "14 tasks queued, the oldest for 97s",
        NOW - timedelta(minutes=9),
        NOW - timedelta(minutes=2),
        "bob@ops",
        NOW - timedelta(minutes=8),
        None,
    ),
    AlertView(
        _id(303),
        "duplicate_provider_job",
        "critical",
        "OPEN",
        "task",
        str(_id(6)),
        "two jobs at runway for one request key",
        NOW - timedelta(minutes=31),
        NOW - timedelta(minutes=31),
        None,
        None,
        None,
    ),
]


def _audit() -> AuditReport:
    ok = [
        ("I1.2", "one task per (tenant, idempotency key): retried creates never make a second task"),
        ("I2.2", "every parked task has an open alert (a human was told)"),
        ("I4.1", "each ledger business key is booked once"),
    ]
    results = [CheckResult(cid, text, 0, []) for cid, text in ok]
    results.insert(
        2,
        CheckResult(
            "I4.6",
            "each tenant's cached balance equals the sum of its ledger",
            2,
            [
                {"tenant_id": ACME, "credit_balance": Decimal("999.00000000"), "ledger_sum": Decimal("994.00000000")},
                {"tenant_id": _id(9), "credit_balance": Decimal("10.00000000"), "ledger_sum": Decimal("0E-8")},
            ],
        ),
    )
    return AuditReport(
        results,
        [
            Skipped(
                "I3.1",
                "exactly one provider job per submitted task",
                "needs the provider's ground truth, not our tables",
            )
        ],
    )


class FixtureData:
    describe = "fixture · sqlite"

    def overview(self) -> Overview:
        return Overview(
            now=NOW,
            by_status={
                "MANUAL_REVIEW": 2,
                "OUTPUT_FETCHING": 1,
                "QUEUED": 14,
                "RETRY_WAIT": 3,
                "RUNNING": 9,
                "SUBMIT_UNKNOWN": 2,
            },
            queue_depth=14,
            queue_p95_age_s=84.0,
            queue_oldest_age_s=97.0,
            submit_unknown=2,
            outbox_due=3,
            outbox_oldest_age_s=1.4,
            dead_letters=1,
            orphans=2,
            reserved_credits=52.0,
            reserved_oldest_age_s=1843.0,
            providers=[ProviderLoad("runway", 7, 10, 0, 0), ProviderLoad("sim", 4, 50, 2, 2)],
            alerts=[AlertLine(a.raised_at, a.severity, a.rule, a.message, a.id) for a in _ALERTS if a.status == "OPEN"],
            roles=[
                RoleLine("api", 1, 2.0, 0, "ok", "api-1:4312"),
                RoleLine("relay", 1, 2.0, 3, "ok", "worker-1:4410"),
                RoleLine("worker", 2, 1.0, 4, "ok", "worker-1:4410, worker-2:977"),
                RoleLine("scheduler", 1, 3.0, 14, "ok", "worker-1:4410"),
                RoleLine(
                    "sweeper",
                    0,
                    412.0,
                    31,
                    "MISSING: work waits",
                    "",
                ),
            ],
        )

    def tasks(self, query: TaskQuery) -> list[TaskRow]:
        rows = [
            TaskRow(
                task_id=_id(i + 1),
                tenant_id=ACME,
                tenant=tenant,
                status=status,
                version=3 + i,
                model="sim-v1",
                provider=provider,
                attempts=att,
                progress=pct,
                parked_reason=None,
                last_error_class=note or None,
                created_at=NOW - timedelta(minutes=ago + 1),
                updated_at=NOW - timedelta(minutes=ago),
            )
            for i, (status, tenant, provider, att, pct, ago, note) in enumerate(_TASKS)
        ]
        return [r for r in rows if (query.status is None or r.status == query.status) and query.keeps(r)]

    def review_items(self) -> list[ReviewView]:
        return [
            ReviewView(
                _id(101),
                _id(1),
                _id(201),
                "prompt matches review term 'fox'",
                "claimed",
                "alice@ops",
                NOW + timedelta(minutes=12),
                None,
                None,
                None,
                NOW - timedelta(minutes=2),
                "MANUAL_REVIEW",
            ),
            ReviewView(
                _id(102),
                _id(8),
                _id(202),
                "media processing failed (timeout): budget spent",
                "pending",
                None,
                None,
                None,
                None,
                None,
                NOW - timedelta(minutes=1),
                "MANUAL_REVIEW",
            ),
        ]

    def review_facts(self, item: ReviewView) -> AssetFacts:
        return AssetFacts(
            asset_id=item.asset_id,
            mime="video/mp4",
            duration_ms=2000,
            size_bytes=1_234_567,
            width=1280,
            height=720,
            status="READY",
            thumbnail=f"/var/lib/aivedio/objects/derivatives/{item.task_id}/thumbnail.jpg",
        )

    def audit(self) -> AuditRun:
        return AuditRun(NOW, 900.0, _audit())

    def alerts(self, query: AlertQuery) -> list[AlertView]:
        return [a for a in _ALERTS if query.keeps(a)]

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the snapshot dataset has no {name!r}")
