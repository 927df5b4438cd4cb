"""`aivedio review list|claim|approve|reject` against outputs really held for review: the sim provider and the
in-process pump run each task through submit, polling, output fetch and media, where the moderation hook
(`media.review_prompt_terms`) holds the ones whose prompt names the review term."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.db.tables import assets, task_state_events
from aivedio_engine.services.errors import Conflict
from aivedio_engine.services.operations import Operation
from aivedio_engine.services.review import ReviewService
from tests.support.seeding import Seeded

PROMPTS = {"fox1": "a red fox at dawn", "fox2": "a fox in the snow", "boat": "a paper boat"}
COST = Decimal(2)  # sim-v1, 2 s at 720p, 1 credit per second


@pytest.fixture
def held(seeder: Callable[..., Seeded]) -> Seeded:
    s = seeder(PROMPTS)
    assert s.task("fox1").status == s.task("fox2").status == "MANUAL_REVIEW"
    assert s.task("boat").status == "SUCCEEDED"
    return s


def ok(result: Any) -> Any:
    assert result.exit_code == 0, (result.exit_code, result.output)
    return json.loads(result.stdout) if result.stdout.lstrip().startswith(("{", "[")) else result.stdout


def refused(result: Any, code: int, fragment: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.stderr.startswith("error: ") and fragment in result.stderr, result.stderr


def history(s: Seeded, name: str) -> list[tuple[str, str, str]]:
    e = task_state_events.c
    return [
        (r.from_status, r.to_status, r.source)
        for r in s.all(
            sa.select(e.from_status, e.to_status, e.source)
            .where(e.task_id == s.tasks[name], e.outcome == "applied")
            .order_by(e.task_version)
        )
    ]


def test_list_shows_the_held_outputs_and_filters_by_state(held: Seeded) -> None:
    items = ok(held.cli("review", "list", "--json"))
    assert sorted(i["task_id"] for i in items) == sorted(str(held.tasks[n]) for n in ("fox1", "fox2"))
    assert {(i["state"], i["task_status"], i["reason"]) for i in items} == {
        ("pending", "MANUAL_REVIEW", "prompt matches review term 'fox'")
    }
    assert ok(held.cli("review", "list", "--state", "claimed", "--json")) == []
    assert ok(held.cli("review", "list", "--state", "decided", "--json")) == []
    assert str(held.review_item("fox1").id) in ok(held.cli("review", "list"))
    cut = held.cli("review", "list", "--limit", "1")
    assert cut.exit_code == 0 and len(cut.stdout.splitlines()) == 1
    assert cut.stderr.strip() == "1 of 2 review item(s) shown; --limit shows more"
    refused(held.cli("review", "list", "--state", "open"), 2, "--state must be one of")


def test_claims_are_exclusive_until_they_expire_then_another_reviewer_takes_over(held: Seeded) -> None:
    item = str(held.review_item("fox1").id)
    claimed = ok(held.cli("review", "claim", item, "--as", "alice", "--ttl", "60", "--json"))["item"]
    assert (claimed["state"], claimed["claimed_by"]) == ("claimed", "alice")

    refused(held.cli("review", "claim", item, "--as", "bob"), 4, "claimed by alice")
    assert [i["id"] for i in ok(held.cli("review", "list", "--state", "claimed", "--json"))] == [item]

    held.advance(59)
    refused(held.cli("review", "claim", item, "--as", "bob"), 4, "claimed by alice")
    held.advance(2)  # alice's claim has lapsed: the item is back in the pending queue
    pending = ok(held.cli("review", "list", "--state", "pending", "--json"))
    assert item in [i["id"] for i in pending]
    assert ok(held.cli("review", "list", "--state", "claimed", "--json")) == []

    taken = ok(held.cli("review", "claim", item, "--as", "bob", "--json"))["item"]
    assert taken["claimed_by"] == "bob"
    refused(held.cli("review", "approve", item, "--as", "alice", "--reason", "late", "--yes"), 4, "claimed by bob")

    rows = held.audit_rows("review claim")
    assert [(r.outcome, r.args["reviewer"], r.affected_ids) for r in rows] == [
        ("claimed", "alice", [item]),
        ("claimed", "bob", [item]),
    ]  # refused claims change nothing


def race_for(service: ReviewService, item: Any, reviewers: tuple[str, ...]) -> dict[str, str]:
    """Every reviewer claims `item` at the same moment (a barrier, not a sleep); who won, who lost."""
    start = threading.Barrier(len(reviewers))
    outcomes: dict[str, str] = {}

    def claim(who: str) -> None:
        start.wait()
        try:
            service.claim(item, who, Operation("review claim", None), 60)
            outcomes[who] = "won"
        except Conflict:
            outcomes[who] = "lost"

    threads = [threading.Thread(target=claim, args=(who,)) for who in reviewers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return outcomes


def test_two_concurrent_claims_have_exactly_one_winner(held: Seeded) -> None:
    service = held.ctx.review
    for name in ("fox1", "fox2"):
        outcomes = race_for(service, held.review_item(name).id, ("alice", "bob"))
        assert sorted(outcomes.values()) == ["lost", "won"], outcomes
        winner = next(w for w, o in outcomes.items() if o == "won")
        assert held.review_item(name).claimed_by == winner


def test_approve_by_the_claimant_succeeds_the_task_and_settles_in_one_transaction(held: Seeded) -> None:
    item = str(held.review_item("fox1").id)
    before = held.balance()
    ok(held.cli("review", "claim", item, "--as", "alice"))

    decided = ok(held.cli("review", "approve", item, "--as", "alice", "--reason", "fine art", "--yes", "--json"))

    assert decided["task_status"] == "SUCCEEDED" and decided["settled"] == str(COST.quantize(Decimal("1e-8")))
    assert (decided["item"]["state"], decided["item"]["decided_by"], decided["item"]["note"]) == (
        "approved",
        "alice",
        "fine art",
    )
    task = held.task("fox1")
    assert (task.status, task.review_state, task.actual_cost, task.reserved_amount) == (
        "SUCCEEDED",
        "APPROVED",
        COST,
        0,
    )
    assert history(held, "fox1")[-1] == ("MANUAL_REVIEW", "SUCCEEDED", "admin")
    assert held.ledger("fox1") == [("RESERVE", -COST), ("SETTLE", 0)]  # +estimate − actual
    assert held.balance() == before  # the reservation already took the cost; settling moves nothing back
    (row,) = held.audit_rows("review approve")
    assert (row.reason, row.outcome, row.dry_run) == ("fine art", "approved", False)
    assert row.affected_ids == [item, str(held.tasks["fox1"])]

    refused(
        held.cli("review", "approve", item, "--as", "alice", "--reason", "again", "--yes"),
        4,
        "already approved by alice",
    )
    assert ok(held.cli("review", "list", "--state", "decided", "--json"))[0]["id"] == item


def test_reject_of_an_unclaimed_item_claims_it_implicitly_fails_the_task_and_still_settles(held: Seeded) -> None:
    item = str(held.review_item("fox2").id)
    before = held.balance()

    decided = ok(
        held.cli("review", "reject", str(held.tasks["fox2"]), "--as", "carol", "--reason", "gore", "--yes", "--json")
    )  # a task id finds its open item

    assert decided["item"]["id"] == item and decided["task_status"] == "FAILED_FINAL"
    task = held.task("fox2")
    assert (task.status, task.review_state, task.last_error_class) == ("FAILED_FINAL", "REJECTED", "review_rejected")
    assert history(held, "fox2")[-1] == ("MANUAL_REVIEW", "FAILED_FINAL", "admin")
    # the provider delivered: its cost is real even though the output is refused
    assert held.ledger("fox2") == [("RESERVE", -COST), ("SETTLE", 0)] and task.actual_cost == COST
    assert held.balance() == before
    assert held.review_item("fox2").claimed_by == "carol"
    (row,) = held.audit_rows("review reject")
    assert (row.reason, row.outcome) == ("gore", "rejected")


def test_mutations_need_a_reason_a_confirmation_and_a_dry_run_changes_nothing(held: Seeded) -> None:
    item = str(held.review_item("fox1").id)
    refused(held.cli("review", "approve", item, "--yes"), 2, "--reason is required")
    refused(held.cli("review", "approve", item, "--reason", "ok"), 4, "pass --yes")  # no terminal: no prompt

    preview = ok(held.cli("review", "approve", item, "--dry-run", "--reason", "would", "--json"))

    assert preview["dry_run"] is True and preview["task_status"] == "SUCCEEDED"
    assert held.task("fox1").status == "MANUAL_REVIEW" and held.review_item("fox1").state == "PENDING"
    assert held.ledger("fox1") == [("RESERVE", -COST)]
    (row,) = held.audit_rows("review approve")
    assert (row.dry_run, row.reason) == (True, "would")
    ok(held.cli("review", "approve", item, "--reason", "now for real", "--yes"))  # the dry run left it decidable
    assert held.task("fox1").status == "SUCCEEDED"


def test_unknown_and_malformed_items(held: Seeded) -> None:
    refused(held.cli("review", "claim", "not-a-uuid"), 2, "not a review item or task id")
    refused(held.cli("review", "claim", str(held.tasks["boat"])), 5, "not found")  # a task never held
    refused(held.cli("review", "claim", str(held.review_item("fox1").id), "--ttl", "0"), 2, "ttl must be")


def test_an_output_that_is_not_playable_can_only_be_rejected(held: Seeded) -> None:
    """A task held after media processing failed past its budget has no playable derivative; approving it would
    be a SUCCEEDED task nobody can play. Here the derivatives are marked FAILED to stand in for that."""
    raw = held.task("fox1").output_asset_id
    held.execute(assets.update().where(assets.c.parent_asset_id == raw).values(status="FAILED"))
    item = str(held.review_item("fox1").id)

    refused(held.cli("review", "approve", item, "--reason", "ok", "--yes"), 4, "no playable output")
    assert held.task("fox1").status == "MANUAL_REVIEW"
    ok(held.cli("review", "reject", item, "--reason", "broken", "--yes"))
    assert held.task("fox1").status == "FAILED_FINAL"
    # nothing was delivered and the reject only says so: the tenant pays nothing, the vendor's bill is ours
    assert [t for t, _ in held.ledger("fox1")] == ["RESERVE", "RELEASE", "ADJUSTMENT"]


def test_a_held_task_the_review_sla_decided_cannot_be_claimed_or_decided_again(held: Seeded) -> None:
    deadline = held.task("fox1").deadline_at
    held.advance((deadline - held.ctx.clock.now()).total_seconds() + 1)
    held.ctx.sweeper.sweep()
    assert held.task("fox1").status == "MANUAL_REVIEW"  # the deadline does not expire a held output
    held.advance(held.ctx.settings.review.sla_s)
    held.ctx.sweeper.sweep()
    assert held.task("fox1").status == "FAILED_FINAL"
    item = str(held.review_item("fox1").id)

    refused(held.cli("review", "claim", item), 4, "already rejected by review-sla")
    refused(held.cli("review", "reject", item, "--reason", "x", "--yes"), 4, "already rejected by review-sla")
