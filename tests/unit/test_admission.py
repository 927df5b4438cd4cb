"""Admission: four nested limits, strict tiers, round-robin across tenants, FIFO within a tenant."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aivedio_engine.domain.admission import (
    PLATFORM_SCOPE,
    Candidate,
    Limits,
    PriorityTier,
    backlogged,
    exempt_from_shedding,
    scope_names,
    select,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ROOMY = Limits(platform=1000, tenant_default=1000, providers={"p": 1000, "q": 1000})


def queue(
    tenant: str, n: int, *, provider: str = "p", model: str = "m", tier: int = PriorityTier.PAID, start: int = 0
) -> list[Candidate]:
    return [
        Candidate(f"{tenant}{i}", tenant, provider, model, T0 + timedelta(seconds=start + i), tier=tier)
        for i in range(n)
    ]


def rounds(candidates: list[Candidate], limits: Limits, per_round: int, n_rounds: int) -> list[list[str]]:
    """Run the scheduler loop: each round picks, the picks leave the queue and keep their slots."""
    pending = list(candidates)
    counts: Counter[str] = Counter()
    cursor: dict[int, str] = {}
    out = []
    for _ in range(n_rounds):
        sel = select(pending, counts, limits, max_picks=per_round, cursor=cursor)
        out.append([c.task_id for c in sel.picks])
        picked = {c.task_id for c in sel.picks}
        pending = [c for c in pending if c.task_id not in picked]
        counts, cursor = Counter(sel.counts), dict(sel.cursor)
    return out


def test_scope_names_are_the_four_nested_scopes() -> None:
    assert scope_names("T", "P", "M") == ("platform", "tenant:T", "provider:P", "model:P/M")
    limits = Limits(platform=64, tenant_default=8, tenants={"T": 2}, providers={"P": 4}, models={"P/M": 3})
    assert limits.chain("T", "P", "M") == (("platform", 64), ("tenant:T", 2), ("provider:P", 4), ("model:P/M", 3))
    assert limits.chain("U", "P", "N")[1:] == (("tenant:U", 8), ("provider:P", 4), ("model:P/N", 4))
    assert limits.chain("U", "unknown", "M")[2] == ("provider:unknown", 0)  # never dispatch to it


def test_a_small_tenant_is_not_starved_by_a_big_one() -> None:
    """A has 100 queued, B has 2, same tier, 2 picks per round: B's both tasks go in the first two rounds."""
    got = rounds(queue("A", 100) + queue("B", 2, start=1000), ROOMY, per_round=2, n_rounds=3)
    assert got == [["A0", "B0"], ["A1", "B1"], ["A2", "A3"]]


def test_round_robin_continues_across_rounds_with_one_pick_each() -> None:
    got = rounds(queue("A", 10) + queue("B", 10) + queue("C", 10), ROOMY, per_round=1, n_rounds=6)
    assert got == [["A0"], ["B0"], ["C0"], ["A1"], ["B1"], ["C1"]]


def test_without_history_the_tenant_waiting_longest_goes_first() -> None:
    sel = select(queue("A", 3, start=50) + queue("B", 3, start=0), {}, ROOMY, max_picks=1)
    assert [c.task_id for c in sel.picks] == ["B0"]


def test_higher_tier_first_then_lower_tiers_get_the_rest() -> None:
    cands = (
        queue("free", 5, tier=PriorityTier.FREE_PREVIEW, start=-100)
        + queue("paid", 2, tier=PriorityTier.PAID)
        + queue("vip", 1, tier=PriorityTier.CUSTOM_PROJECT, start=500)
    )
    sel = select(cands, {}, ROOMY, max_picks=4)
    assert [c.task_id for c in sel.picks] == ["vip0", "paid0", "paid1", "free0"]


def test_a_lower_tier_uses_capacity_a_blocked_higher_tier_cannot() -> None:
    limits = Limits(platform=10, tenant_default=10, providers={"p": 1, "q": 5})
    cands = queue("paid", 3, provider="p") + queue("free", 3, provider="q", tier=PriorityTier.FREE_PREVIEW)
    sel = select(cands, {"provider:p": 1}, limits, max_picks=10)
    assert [c.task_id for c in sel.picks] == ["free0", "free1", "free2"]


def test_fifo_within_a_tenant_by_created_at_then_priority() -> None:
    same = T0 + timedelta(seconds=5)
    cands = [
        Candidate("late", "A", "p", "m", T0 + timedelta(seconds=9), priority=100),
        Candidate("tie-low", "A", "p", "m", same, priority=1),
        Candidate("tie-high", "A", "p", "m", same, priority=50),
        Candidate("early", "A", "p", "m", T0),
    ]
    sel = select(cands, {}, ROOMY, max_picks=4)
    assert [c.task_id for c in sel.picks] == ["early", "tie-high", "tie-low", "late"]


@pytest.mark.parametrize(
    ("counts", "limits", "expected"),
    [
        ({PLATFORM_SCOPE: 3}, Limits(4, 10, providers={"p": 10}), 1),  # platform
        ({"tenant:A": 1}, Limits(10, 2, providers={"p": 10}), 1),  # tenant default
        ({}, Limits(10, 10, tenants={"A": 3}, providers={"p": 10}), 3),  # tenant row
        ({"provider:p": 2}, Limits(10, 10, providers={"p": 4}), 2),  # provider
        ({}, Limits(10, 10, providers={"p": 4}, models={"p/m": 1}), 1),  # model
    ],
)
def test_each_nested_limit_caps_the_picks(counts: dict[str, int], limits: Limits, expected: int) -> None:
    assert len(select(queue("A", 10), counts, limits, max_picks=10).picks) == expected


def test_a_full_provider_does_not_block_the_tenants_other_tasks() -> None:
    limits = Limits(platform=10, tenant_default=10, providers={"p": 1, "q": 2})
    cands = [Candidate(f"{p}{i}", "A", p, "m", T0 + timedelta(seconds=i)) for p in "pq" for i in range(3)]
    sel = select(cands, {}, limits, max_picks=10)
    assert [c.task_id for c in sel.picks] == ["p0", "q0", "q1"]  # p0 fills p; p1, p2 wait, q's go


def test_submit_budget_gates_providers() -> None:
    limits = Limits(platform=10, tenant_default=10, providers={"p": 10, "q": 10})
    cands = queue("A", 3, provider="p") + [Candidate(f"q{i}", "B", "q", "m", T0) for i in range(3)]
    sel = select(cands, {}, limits, max_picks=10, submit_budget={"p": 0, "q": 1})  # p open, q half-open
    assert [c.task_id for c in sel.picks] == ["q0"]


def test_duplicate_rows_in_a_snapshot_are_picked_once() -> None:
    c = queue("A", 1)
    assert len(select(c + c, {}, ROOMY, max_picks=5).picks) == 1


# --- properties ---------------------------------------------------------------------------------------------

candidate_st = st.builds(
    Candidate,
    task_id=st.uuids().map(str),
    tenant_id=st.sampled_from(["A", "B", "C", "D"]),
    provider=st.sampled_from(["p", "q"]),
    model=st.sampled_from(["m1", "m2"]),
    created_at=st.integers(0, 100).map(lambda s: T0 + timedelta(seconds=s)),
    priority=st.integers(0, 3),
    tier=st.integers(1, 3),
)
limits_st = st.builds(
    Limits,
    platform=st.integers(0, 12),
    tenant_default=st.integers(0, 5),
    tenants=st.dictionaries(st.sampled_from(["A", "B"]), st.integers(0, 5)),
    providers=st.fixed_dictionaries({"p": st.integers(0, 6), "q": st.integers(0, 6)}),
    models=st.dictionaries(st.sampled_from(["p/m1", "q/m2"]), st.integers(0, 4)),
)
counts_st = st.dictionaries(
    st.sampled_from(["platform", "tenant:A", "tenant:C", "provider:p", "provider:q", "model:p/m1"]),
    st.integers(0, 4),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(candidate_st, max_size=30), counts_st, limits_st, st.integers(0, 15))
def test_picks_never_exceed_a_limit_and_leave_nothing_that_fits(
    cands: list[Candidate], counts: dict[str, int], limits: Limits, max_picks: int
) -> None:
    sel = select(cands, counts, limits, max_picks=max_picks)
    assert len(sel.picks) <= max_picks
    assert len({c.task_id for c in sel.picks}) == len(sel.picks)
    after = Counter(counts)
    for c in sel.picks:
        for scope, limit in limits.chain(c.tenant_id, c.provider, c.model):
            assert after[scope] < limit, (scope, after[scope], limit)  # room before each pick
            after[scope] += 1
    assert dict(after) == dict(Counter(sel.counts))
    tiers = [c.tier for c in sel.picks]
    assert tiers == sorted(tiers)  # strict tiers: never a lower tier before a higher one
    if len(sel.picks) < max_picks:  # work-conserving: whatever is left does not fit
        picked = {c.task_id for c in sel.picks}
        for c in cands:
            if c.task_id not in picked:
                assert any(after[s] >= lim for s, lim in limits.chain(c.tenant_id, c.provider, c.model))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from("ABCDE"), st.integers(1, 12), min_size=1), st.integers(1, 20))
def test_unconstrained_round_robin_is_fair_within_one(queued: dict[str, int], max_picks: int) -> None:
    cands = [c for t, n in queued.items() for c in queue(t, n)]
    per_tenant = Counter(c.tenant_id for c in select(cands, {}, ROOMY, max_picks=max_picks).picks)
    # a tenant that still had tasks left got at most one fewer than anyone else
    short = [per_tenant[t] for t, n in queued.items() if per_tenant[t] < n]
    if short:
        assert max(per_tenant.values()) - min(short) <= 1


def test_shedding_starts_strictly_after_the_limit_and_spares_exempt_tiers() -> None:
    assert not backlogged(None, 300) and not backlogged(300, 300) and backlogged(300.5, 300)
    assert not backlogged(10**6, 0)  # 0 turns shedding off
    assert exempt_from_shedding(1, 1) and exempt_from_shedding(PriorityTier.CUSTOM_PROJECT, 2)
    assert not exempt_from_shedding(PriorityTier.PAID, 1) and not exempt_from_shedding(1, None)
