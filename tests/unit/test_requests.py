"""Request normalization and hashing: what counts as 'the same request' for idempotency."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aivedio_engine.domain.requests import (
    Catalog,
    InvalidRequest,
    ModelSpec,
    estimate_cost,
    normalize,
    request_hash,
)

CATALOG = Catalog(
    models=(
        ModelSpec("local", "local-v1", 10, ("360p", "720p"), {"360p": Decimal("0.5"), "720p": Decimal("1")}),
        ModelSpec("sim", "sim-v1", 8, ("720p",), {"720p": Decimal("2")}),
        ModelSpec("sim", "local-v1", 6, ("720p",), {"720p": Decimal("3")}),
    ),
    default_provider="local",
    default_deadline_s=3600,
)
BASE = {"prompt": "a fox", "model": "local-v1"}


def test_defaults_are_filled_and_the_default_provider_preferred() -> None:
    p = normalize(BASE, CATALOG)
    assert (p.provider, p.duration_s, p.resolution, p.aspect_ratio, p.priority, p.deadline_s, p.seed) == (
        "local",
        5,
        "360p",
        "16:9",
        0,
        3600,
        None,
    )
    assert normalize({**BASE, "provider": "sim"}, CATALOG).provider == "sim"


def test_spelled_out_defaults_reordered_keys_and_whitespace_hash_the_same() -> None:
    a = normalize(BASE, CATALOG)
    b = normalize(
        {
            "model": "local-v1",
            "resolution": "360p",
            "duration_s": 5,
            "prompt": " a fox\n",
            "provider": "local",
            "aspect_ratio": "16:9",
            "priority": 0,
            "deadline_s": 3600,
        },
        CATALOG,
    )
    assert request_hash(a) == request_hash(b)
    assert request_hash(a) != request_hash(normalize({**BASE, "seed": 1}, CATALOG))
    assert request_hash(a) != request_hash(normalize({**BASE, "prompt": "a fox!"}, CATALOG))


def test_unicode_forms_of_one_prompt_are_one_request() -> None:
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert request_hash(normalize({**BASE, "prompt": composed}, CATALOG)) == request_hash(
        normalize({**BASE, "prompt": decomposed}, CATALOG)
    )


def test_asset_ids_keep_order_and_drop_repeats() -> None:
    a, b = "0192f000-0000-7000-8000-000000000001", "0192F000-0000-7000-8000-000000000002"
    p = normalize({**BASE, "asset_ids": [a, b, a]}, CATALOG)
    assert p.asset_ids == (a, b.lower())
    assert request_hash(p) != request_hash(normalize({**BASE, "asset_ids": [b, a]}, CATALOG))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": "nope"}, "model"),
        ({"provider": "runway"}, "provider"),
        ({"model": "sim-v1", "provider": "local"}, "provider"),
        ({"duration_s": 11}, "duration_s"),
        ({"duration_s": 2.5}, "duration_s"),
        ({"duration_s": True}, "duration_s"),
        ({"resolution": "4k"}, "resolution"),
        ({"aspect_ratio": "5:4"}, "aspect_ratio"),
        ({"priority": -1}, "priority"),
        ({"deadline_s": 5}, "deadline_s"),
        ({"seed": -3}, "seed"),
        ({"prompt": "   "}, "prompt"),
        ({"prompt": "x" * 4001}, "prompt"),
        ({"asset_ids": ["not-a-uuid"]}, "asset_ids"),
        ({"asset_ids": ["0192f000-0000-7000-8000-000000000001"] * 9}, "asset_ids"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_invalid_parameters_name_the_field(change: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        normalize({**BASE, **change}, CATALOG)
    assert info.value.field == field


def test_an_unknown_model_or_provider_is_told_what_is_valid() -> None:
    with pytest.raises(InvalidRequest, match=r"^model: unknown model 'x' \(known: local-v1, sim-v1\)$"):
        CATALOG.find("x", None)
    with pytest.raises(
        InvalidRequest, match=r"^provider: provider 'acme' does not offer model 'sim-v1' \(offered by: sim\)$"
    ):
        CATALOG.find("sim-v1", "acme")
    assert Catalog((), "local", 60).known_models() == "none configured"


def test_cost_is_price_per_second_times_duration() -> None:
    spec = CATALOG.find("local-v1", None)
    assert estimate_cost(normalize({**BASE, "duration_s": 4, "resolution": "720p"}, CATALOG), spec) == Decimal("4")
    assert estimate_cost(normalize({**BASE, "duration_s": 3}, CATALOG), spec) == Decimal("1.5")


@given(st.dictionaries(st.sampled_from(["duration_s", "priority", "seed"]), st.integers(1, 5)))
def test_hash_is_independent_of_key_order(extra: dict) -> None:
    forward = {**BASE, **extra}
    backward = dict(reversed(list(forward.items())))
    assert request_hash(normalize(forward, CATALOG)) == request_hash(normalize(backward, CATALOG))
