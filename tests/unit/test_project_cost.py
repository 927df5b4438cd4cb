"""A project's cost estimated up front (domain/project_cost.py): clips priced like the generation they create,
local steps from `[workflows] local_step_credits`, per-shot steps counted from the storyboard the plan step makes,
and the setting's validation."""

from __future__ import annotations

from decimal import Decimal

import pytest
from pydantic import ValidationError

from aivedio_engine.config import WorkflowSettings
from aivedio_engine.domain.project_cost import (
    MAX_SHOTS,
    clip_request,
    default_model,
    estimate_project,
    storyboard,
)
from aivedio_engine.domain.requests import Catalog, ModelSpec, estimate_cost, normalize
from aivedio_engine.workflows.catalog import PHOTO_STORY

CHEAP = ModelSpec("local", "local-v1", 10, ("360p", "720p"), {"360p": Decimal("0.5"), "720p": Decimal("1")})
OTHER = ModelSpec("vendor", "pricey", 10, ("720p",), {"720p": Decimal("9")})
CATALOG = Catalog((OTHER, CHEAP), default_provider="local", default_deadline_s=600)
SCRIPT = "This is the harbour where I grew up. Every morning the boats went out before sunrise. Hi."


def test_storyboard_sizes_shots_from_their_words() -> None:
    shots = storyboard(SCRIPT)
    assert [(s.text, s.duration_s) for s in shots] == [
        ("This is the harbour where I grew up.", 4),  # 8 words at 2.6 words/s, whole seconds up
        ("Every morning the boats went out before sunrise.", 4),
        ("Hi.", 1),
    ]


def test_clips_are_priced_like_the_generation_they_create() -> None:
    est = estimate_project(PHOTO_STORY, {"photo_asset_id": "x", "script": SCRIPT}, CATALOG, {})
    clips = {c.step: c.credits for c in est.steps if c.step.startswith("clip")}
    # the default provider's model at its first resolution: 0.5 credits/s × 4, 4, 1 s
    assert clips == {"clip[0]": Decimal("2"), "clip[1]": Decimal("2"), "clip[2]": Decimal("0.5")}
    assert est.total == Decimal("4.5")
    assert all(c.credits == 0 for c in est.steps if not c.vendor)
    # the same figure generation creation reserves for the request the runner sends
    spec = default_model(CATALOG)
    assert spec is CHEAP
    params = normalize(clip_request(spec.model, "Hi.", 1) | {"asset_ids": []}, CATALOG)
    assert estimate_cost(params, CHEAP) == clips["clip[2]"]
    # one entry per step instance the project will run: 8 single steps + 3 per-shot steps × 3 shots
    assert len(est.steps) == 8 + 3 * 3


def test_configured_local_prices_add_to_the_estimate() -> None:
    inp = {"script": SCRIPT}
    free = estimate_project(PHOTO_STORY, inp, CATALOG, {})
    priced = estimate_project(PHOTO_STORY, inp, CATALOG, {"composition": Decimal("2"), "final_image": Decimal("0.25")})
    # composition once, one image per shot
    assert priced.total - free.total == Decimal("2") + 3 * Decimal("0.25")
    assert {c.step: c.credits for c in priced.steps}["image[1]"] == Decimal("0.25")


@pytest.mark.parametrize("script", ["", "   ", None, "Go. " * (MAX_SHOTS + 1)])
def test_a_script_the_plan_refuses_makes_no_shots(script: object) -> None:
    est = estimate_project(PHOTO_STORY, {"script": script}, CATALOG, {"final_image": Decimal(1)})
    assert not [c for c in est.steps if "[" in c.step] and est.total == 0


def test_no_models_estimates_vendor_steps_at_zero() -> None:
    est = estimate_project(PHOTO_STORY, {"script": SCRIPT}, Catalog((), "local", 600), {})
    assert est.total == 0


@pytest.mark.parametrize(
    ("credits", "message"),
    [
        ({"teleport": "1"}, "unknown step type teleport"),
        ({"video_clip": "1"}, "video_clip run as generation tasks"),
        ({"tts": "-1"}, "cannot be negative"),
    ],
)
def test_local_step_credits_are_validated(credits: dict[str, str], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        WorkflowSettings(local_step_credits=credits)  # type: ignore[arg-type]
    assert WorkflowSettings(local_step_credits={"tts": "0.5"}).local_step_credits == {"tts": Decimal("0.5")}  # type: ignore[dict-item]
