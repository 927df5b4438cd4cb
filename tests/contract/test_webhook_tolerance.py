"""`webhooks.tolerance_s` is the replay window of every adapter whose callbacks carry a signed timestamp.

Adapters are built the way the engine builds them (`providers.registry.build_adapter` from `Settings`), so a
tolerance that stops at the registry, or an adapter that keeps its own constant, fails here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta

import pytest

from aivedio_engine.config import ProviderSettings, Settings
from aivedio_engine.providers.base import CallbackRejected
from aivedio_engine.providers.registry import TIMESTAMPED_CALLBACKS, build_adapter
from aivedio_engine.providers.webhooks import new_secret, sign_webhook
from tests.support.vendors import (
    FAL_PUBLIC,
    NOW,
    REPLICATE_SECRET,
    fixture,
    settings,
    sign_fal,
    sign_replicate,
)

SIM_SECRET = new_secret(b"sim-tolerance-test-secret-32byte")


def _sim() -> ProviderSettings:
    return settings("sim", "sim-v1", "", [SIM_SECRET]).model_copy(update={"base_url": "http://127.0.0.1:9"})


def _sim_body() -> bytes:
    return json.dumps({"id": "job-1", "status": "running", "updated_at": NOW.isoformat()}).encode()


def _sign_sim(body: bytes, when: object) -> dict[str, str]:
    return sign_webhook([SIM_SECRET], "msg_tolerance", when, body)  # type: ignore[arg-type]


VENDORS: dict[str, tuple[Callable[[], ProviderSettings], Callable[[], bytes], Callable[..., dict[str, str]]]] = {
    "replicate": (
        lambda: settings("replicate", "owner/model", "r8_key", [REPLICATE_SECRET]),
        lambda: json.dumps(fixture("replicate", "callback_prediction")["body"]).encode(),
        sign_replicate,
    ),
    "fal": (
        lambda: settings("fal", "fal-ai/kling-video/v2/master/text-to-video", "fal_key", [FAL_PUBLIC]),
        lambda: json.dumps(fixture("fal", "webhook_ok")["body"]).encode(),
        sign_fal,
    ),
    "sim": (_sim, _sim_body, _sign_sim),
}


def test_every_timestamped_adapter_is_covered() -> None:
    assert set(VENDORS) == TIMESTAMPED_CALLBACKS


@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_a_callback_301_s_old_is_refused_with_tolerance_300_and_accepted_with_400(vendor: str) -> None:
    make_cfg, make_body, sign = VENDORS[vendor]
    body = make_body()
    headers = sign(body, NOW - timedelta(seconds=301))

    def adapter(tolerance_s: int) -> object:
        cfg = make_cfg()
        s = Settings(providers={vendor: cfg}, default_provider=vendor, webhooks={"tolerance_s": tolerance_s})
        return build_adapter(vendor, cfg, s)

    with pytest.raises(CallbackRejected):
        adapter(300).parse_callback(headers, body, NOW)  # type: ignore[attr-defined]
    events = adapter(400).parse_callback(headers, body, NOW)  # type: ignore[attr-defined]
    assert events and events[0].job_id
    # the window is symmetric: a timestamp from the future is held to the same tolerance
    ahead = sign(body, NOW + timedelta(seconds=301))
    with pytest.raises(CallbackRejected):
        adapter(300).parse_callback(ahead, body, NOW)  # type: ignore[attr-defined]
    assert adapter(400).parse_callback(ahead, body, NOW)  # type: ignore[attr-defined]
