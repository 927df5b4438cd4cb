"""Client webhooks, pure parts: the retry schedule of the default budget, event filters, rotation's secrets, and
the egress address policy (with and without `allow_private_networks`)."""

from __future__ import annotations

import ipaddress
import random
from datetime import UTC, datetime, timedelta

import pytest
from standardwebhooks.webhooks import Webhook

from aivedio_engine.config import Settings
from aivedio_engine.domain import webhooks as rules
from aivedio_engine.domain.retry import Step
from aivedio_engine.fetch.egress import check_destination
from aivedio_engine.fetch.policy import PolicyError, private_network_block_reason

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def schedule(seed: int) -> list[float]:
    """Seconds after the first attempt at which each attempt runs, until the budget says DEAD."""
    budget = Settings().retry.budget(Step.NOTIFICATION)
    rng = random.Random(seed)
    at, times = T0, [0.0]
    while (nxt := rules.next_attempt_at(budget, len(times), T0, at, rng)) is not None:
        at = nxt
        times.append((at - T0).total_seconds())
    return times


def test_the_default_budget_spreads_eight_attempts_over_hours() -> None:
    for seed in range(20):
        times = schedule(seed)
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert len(times) == 8
        # exponential: each gap within [cap/2, cap] of 5 s × 4^n, capped at 3 h
        caps = [min(10_800, 5 * 4**n) for n in range(7)]
        assert all(c / 2 <= g <= c for g, c in zip(gaps, caps, strict=True)), gaps
        assert 2.4 * 3600 < times[-1] < 5 * 3600, times[-1]


def test_the_budget_s_total_wait_ends_retries_early() -> None:
    budget = Settings(retry={"notification": {"max_total_wait_s": 60}}).retry.budget(Step.NOTIFICATION)
    rng = random.Random(1)
    assert rules.next_attempt_at(budget, 3, T0, T0 + timedelta(seconds=10), rng) is not None
    assert rules.next_attempt_at(budget, 5, T0, T0 + timedelta(seconds=59), rng) is None


def test_event_filter() -> None:
    assert rules.parse_event_filter([]) == () and rules.parse_event_filter(["*"]) == ()
    assert rules.parse_event_filter(["succeeded,failed_final", "SUCCEEDED"]) == ("SUCCEEDED", "FAILED_FINAL")
    with pytest.raises(ValueError, match=r"unknown event 'DONE' \(known: \*, CREATED"):
        rules.parse_event_filter(["DONE"])
    assert rules.wants((), "QUEUED") and rules.wants(("SUCCEEDED",), "SUCCEEDED")
    assert not rules.wants(("SUCCEEDED",), "RUNNING")


def test_rotation_keeps_the_old_secret_signing_until_the_grace_ends() -> None:
    old, new = rules.new_secret(b"a" * 32), rules.new_secret(b"b" * 32)
    until = T0 + timedelta(hours=1)
    assert rules.signing_secrets(new, old, until, T0) == [new, old]
    assert rules.signing_secrets(new, old, until, until) == [new]
    assert rules.signing_secrets(new, None, None, T0) == [new]
    # the secrets are what the library reads
    assert Webhook(new).sign("msg_1", T0, "{}").startswith("v1,")
    with pytest.raises(ValueError):
        rules.new_secret(b"short")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/x",
        "http://[::1]/x",
        "http://10.0.0.8/x",
        "http://0x7f.1/x",
        "http://2130706433/x",
        "http://169.254.169.254/latest/meta-data",
        "http://[::ffff:127.0.0.1]/x",
        "http://0.0.0.0:8080/x",
    ],
)
def test_non_public_literals_are_refused_by_default(url: str) -> None:
    with pytest.raises(PolicyError, match="blocked address"):
        check_destination(url, allow_private=False)


def test_allow_private_networks_opens_private_ranges_but_never_metadata() -> None:
    for ok in ("127.0.0.1", "10.0.0.8", "192.168.1.1", "::1", "fe80::1", "172.16.0.1"):
        assert private_network_block_reason(ipaddress.ip_address(ok)) is None, ok
    for bad in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "0.0.0.0", "::ffff:127.0.0.1", "224.0.0.1"):
        assert private_network_block_reason(ipaddress.ip_address(bad)) is not None, bad
    assert check_destination("http://127.0.0.1:9/x", allow_private=True).port == 9
    with pytest.raises(PolicyError):
        check_destination("http://169.254.169.254/", allow_private=True)
    assert check_destination("https://hooks.example.com/x?a=1", allow_private=False).host == "hooks.example.com"
