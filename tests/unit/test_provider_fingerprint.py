"""The request fingerprint shared by the attempt row and the adapters' job listings."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from aivedio_engine.db.attempts import fingerprint as attempt_fingerprint
from aivedio_engine.domain.requests import Catalog, ModelSpec, normalize
from aivedio_engine.providers.fingerprint import FIELDS, echoed_fingerprint, request_fingerprint

ECHO = {
    "prompt": "a red fox in snow",
    "model": "sim-v1",
    "duration_s": 5,
    "resolution": "720p",
    "aspect_ratio": "16:9",
    "seed": 7,
}
PRICES = {"720p": Decimal(1), "1080p": Decimal(2)}
CATALOG = Catalog(
    models=(ModelSpec("sim", "sim-v1", 10, ("720p", "1080p"), PRICES),), default_provider="sim", default_deadline_s=3600
)


def test_stable_across_key_order() -> None:
    reordered = dict(reversed(list(ECHO.items())))
    assert list(reordered) != list(ECHO)
    assert request_fingerprint(reordered) == request_fingerprint(ECHO)
    assert len(request_fingerprint(ECHO)) == 32  # sha256


def test_only_the_vendor_visible_fields_count() -> None:
    ours = {
        **ECHO,
        "priority": 50,
        "deadline_s": 600,
        "provider": "sim",
        "asset_ids": [],
        "callback_url": "https://x/cb",
        "request_key": "avd-1",
    }
    assert request_fingerprint(ours) == request_fingerprint(ECHO)
    assert FIELDS == ("prompt", "model", "duration_s", "resolution", "aspect_ratio", "seed")


@pytest.mark.parametrize(
    "field,value",
    [
        ("prompt", "a red fox in rain"),
        ("model", "sim-v2"),
        ("duration_s", 6),
        ("resolution", "1080p"),
        ("aspect_ratio", "9:16"),
        ("seed", 8),
        ("seed", None),
    ],
)
def test_every_field_changes_it(field: str, value: Any) -> None:
    assert request_fingerprint({**ECHO, field: value}) != request_fingerprint(ECHO)


def test_harmless_respellings_still_match() -> None:
    decomposed = "cafe\u0301 at dawn"  # "café" as e + combining accent: NFC makes it one code point
    base = {**ECHO, "prompt": "caf\u00e9 at dawn"}
    assert request_fingerprint({**base, "prompt": f"  {decomposed}\n"}) == request_fingerprint(base)
    assert request_fingerprint({**ECHO, "duration_s": 5.0}) == request_fingerprint(ECHO)
    assert request_fingerprint({**ECHO, "duration_s": 5.5}) != request_fingerprint(ECHO)
    assert request_fingerprint({**ECHO, "duration_s": "5"}) != request_fingerprint(ECHO)  # a real difference


def test_attempt_fingerprint_of_normalised_params_equals_the_echo_of_what_is_sent() -> None:
    params = normalize(
        {"prompt": "  a red fox in snow ", "model": "sim-v1", "duration_s": 5, "seed": 7, "priority": 3}, CATALOG
    ).canonical()
    assert attempt_fingerprint(params) == request_fingerprint(ECHO) == echoed_fingerprint(ECHO)
    no_seed = normalize({"prompt": "a red fox in snow", "model": "sim-v1", "duration_s": 5}, CATALOG).canonical()
    echo = {k: v for k, v in ECHO.items() if k != "seed"}  # a vendor leaves an unset seed out
    assert attempt_fingerprint(no_seed) == echoed_fingerprint(echo)


@pytest.mark.parametrize("missing", ["prompt", "model", "duration_s", "resolution", "aspect_ratio"])
def test_an_echo_missing_a_required_field_is_unknown_not_different(missing: str) -> None:
    assert echoed_fingerprint({k: v for k, v in ECHO.items() if k != missing}) is None
    assert echoed_fingerprint({**ECHO, missing: None}) is None


def test_an_echo_that_is_not_an_object_is_unknown() -> None:
    assert echoed_fingerprint(None) is None
    assert echoed_fingerprint(["prompt"]) is None
