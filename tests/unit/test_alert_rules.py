"""The alert rules as pure functions of facts and thresholds (observability.alert_rules)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from aivedio_engine.clock import new_id
from aivedio_engine.config import AlertSettings
from aivedio_engine.db.alert_facts import Spend
from aivedio_engine.db.alerts import Rule
from aivedio_engine.db.snapshot import id_floor
from aivedio_engine.observability.alert_rules import Facts, evaluate
from aivedio_engine.observability.metrics import percentile

CFG = AlertSettings(
    failed_tasks=5,
    provider_consecutive_failures=3,
    queue_depth=10,
    queue_age_s=600,
    media_failure_rate=0.5,
    media_min_samples=4,
    cost_factor=5,
    cost_min_per_hour=Decimal(10),
    cost_budget_per_hour=Decimal(0),
    min_free_bytes=100,
    min_free_ratio=0.1,
)
GiB = 1024**3


def rules(facts: Facts, cfg: AlertSettings = CFG) -> list[tuple[Rule, str]]:
    return [(f.rule, f.dedup_key) for f in evaluate(facts, cfg)]


def test_healthy_facts_raise_nothing() -> None:
    assert (
        rules(
            Facts(
                failed_tasks=4,
                provider_streaks={"sim": 2},
                queue_depth=9,
                queue_oldest_age_s=599,
                media_finished=10,
                media_failed=4,
                disks={"/d": (50 * GiB, 100 * GiB)},
                spend=[Spend("t", None, Decimal(40), Decimal(10))],
            )
        )
        == []
    )


@pytest.mark.parametrize(
    "facts, expected",
    [
        (Facts(failed_tasks=5), (Rule.FAILED_TASKS_HIGH, "all")),
        (Facts(provider_streaks={"sim": 3, "local": 0}), (Rule.PROVIDER_CONSECUTIVE_FAILURES, "sim")),
        (Facts(queue_depth=10), (Rule.QUEUE_BACKLOG, "queued")),
        (Facts(queue_depth=1, queue_oldest_age_s=600), (Rule.QUEUE_BACKLOG, "queued")),
        (Facts(media_finished=4, media_failed=2), (Rule.MEDIA_FAILURE_RATE, "media")),
        (Facts(disks={"/d": (99, 10_000)}), (Rule.STORAGE_CAPACITY_LOW, "/d")),
        (Facts(disks={"/d": (9 * GiB, 100 * GiB)}), (Rule.STORAGE_CAPACITY_LOW, "/d")),
    ],
)
def test_each_rule_fires_at_its_threshold(facts: Facts, expected: tuple[Rule, str]) -> None:
    assert rules(facts) == [expected]


def test_media_rate_needs_enough_samples() -> None:
    assert rules(Facts(media_finished=3, media_failed=3)) == []


def test_queue_age_needs_a_queue() -> None:
    assert rules(Facts(queue_depth=0, queue_oldest_age_s=10_000)) == []


def test_cost_against_the_previous_day() -> None:
    spike = Spend("t1", None, last_hour=Decimal(51), baseline_per_hour=Decimal(10))
    steady = Spend("t2", None, last_hour=Decimal(50), baseline_per_hour=Decimal(10))
    small = Spend("t3", None, last_hour=Decimal(9), baseline_per_hour=Decimal("0.1"))  # under cost_min_per_hour
    new = Spend("t4", "p4", last_hour=Decimal(1000), baseline_per_hour=Decimal(0))  # no history: no baseline
    found = evaluate(Facts(spend=[spike, steady, small, new]), CFG)
    assert [(f.rule, f.dedup_key, f.subject_type, f.subject_id) for f in found] == [
        (Rule.COST_ANOMALY, "tenant:t1", "tenant", "t1")
    ]
    assert "5 × its hourly mean" in found[0].message


def test_cost_budget_covers_tenants_without_history() -> None:
    budget = CFG.model_copy(update={"cost_budget_per_hour": Decimal(100)})
    found = evaluate(
        Facts(spend=[Spend("t4", "p4", Decimal(101), Decimal(0)), Spend("t5", None, Decimal(100), Decimal(0))]), budget
    )
    assert [(f.dedup_key, f.subject_type) for f in found] == [("project:p4", "project")]
    assert "budget of 100" in found[0].message


def test_same_facts_give_the_same_dedup_keys() -> None:
    facts = Facts(failed_tasks=9, provider_streaks={"a": 5, "b": 5}, disks={"/x": (0, 1)})
    assert rules(facts) == rules(facts)
    assert len({key for _, key in rules(facts)}) == len(rules(facts))


def test_id_floor_orders_like_the_ids_minted_at_that_time() -> None:
    before = new_id()
    floor = id_floor(datetime.now(UTC) + timedelta(milliseconds=2))
    assert before < floor
    assert id_floor(datetime.now(UTC) - timedelta(seconds=1)) < new_id()
    assert str(id_floor(datetime.now(UTC))).split("-")[2].startswith("7")  # a version 7 UUID


def test_percentile_nearest_rank() -> None:
    assert percentile([], 0.95) == 0.0
    assert percentile([5.0], 0.95) == 5.0
    assert percentile([float(i) for i in range(1, 101)], 0.95) == 95.0


def test_workflow_rules_fire_at_their_thresholds_and_not_below() -> None:
    from aivedio_engine.db.workflows import ProjectCost

    pid, tid = new_id(), new_id()
    below = Facts(
        failed_steps=4,
        step_queues={"image": (9, 599.0), "ffmpeg": (0, 0.0)},
        composition_finished=4,
        composition_failed=1,
        project_costs=[
            ProjectCost(pid, tid, Decimal(2), Decimal(10)),
            ProjectCost(new_id(), tid, Decimal(0), Decimal(99)),
        ],
    )
    assert rules(below) == []  # 10 is exactly 5 × 2; a project without an estimate has nothing to exceed
    at = Facts(
        failed_steps=5,
        step_queues={"image": (1, 600.0), "qc": (10, 0.0)},
        composition_finished=4,
        composition_failed=2,
        project_costs=[ProjectCost(pid, tid, Decimal(2), Decimal("10.01"))],
    )
    assert sorted(rules(at)) == sorted(
        [
            (Rule.FAILED_STEPS_HIGH, "all"),
            (Rule.QUEUE_BACKLOG, "workflow:image"),
            (Rule.QUEUE_BACKLOG, "workflow:qc"),
            (Rule.COMPOSITION_FAILURE_RATE, "composition"),
            (Rule.COST_ANOMALY, f"project:{pid}"),
        ]
    )
    # too few composition runs for a rate
    assert rules(Facts(composition_finished=3, composition_failed=3)) == []
