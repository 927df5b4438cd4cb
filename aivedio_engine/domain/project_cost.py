"""A System B project's cost, estimated up front from its workflow and its input ("a project shows its
estimated cost up front and its actual cost as the sum of its steps").

Two kinds of step cost:
- a vendor step (`StepSpec.vendor`, e.g. photo_story's `clip`) runs as a generation task, so it is priced the way
  generation creation prices that task: the request it will send (`clip_request`) normalized against the model
  catalog, then `estimate_cost` — the same two functions `GenerationService.create` calls, so the estimate and
  the reservation agree by construction;
- a local step (ffmpeg, TTS, ...) costs what `[workflows] local_step_credits` says for its step type, 0 when the
  type is not listed.

Per-shot steps count once per shot. The shots are not known before the plan step ran, so the estimate makes the
plan's storyboard from the input itself with `storyboard`, the function the plan step uses: the same script gives
the same shots and durations. A script the plan would refuse (empty, or more than `MAX_SHOTS` sentences) makes no
shots: its per-shot steps are estimated at 0, as they will never run. Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from aivedio_engine.domain.project import WorkflowDef
from aivedio_engine.domain.requests import Catalog, InvalidRequest, ModelSpec, estimate_cost, normalize
from aivedio_engine.domain.workflow import STEP_SPECS, StepType

#: narration pace used to size a shot before its voice exists; shots are whole seconds (the provider's unit)
WORDS_PER_S = 2.6
MAX_SHOTS = 12
MAX_SHOT_S = 10
#: the frame a clip is asked for (photo_story's shots are landscape crops)
CLIP_ASPECT = "16:9"


@dataclass(frozen=True, slots=True)
class Shot:
    text: str
    duration_s: int


def split_script(script: str) -> list[str]:
    """Sentences (., !, ? and their CJK forms end one); empty pieces dropped."""
    parts = re.split(r"(?<=[.!?。！？])\s*", script.strip())
    return [p.strip() for p in parts if p.strip()]


def shot_seconds(text: str) -> int:
    """A shot's length from its words (whole seconds, 1 … MAX_SHOT_S); text without spaces counts 3 chars a word."""
    words = max(1, len(text.split()) if " " in text else math.ceil(len(text) / 3))
    return min(MAX_SHOT_S, max(1, math.ceil(words / WORDS_PER_S)))


def storyboard(script: str) -> list[Shot]:
    """One shot per sentence of the script (the plan step's rule; it refuses more than MAX_SHOTS)."""
    return [Shot(text, shot_seconds(text)) for text in split_script(script)]


def default_model(catalog: Catalog) -> ModelSpec | None:
    """The model a workflow's generation uses: the default provider's first, else the catalog's first."""
    preferred = [m for m in catalog.models if m.provider == catalog.default_provider] or list(catalog.models)
    return preferred[0] if preferred else None


def clip_request(model: str, prompt: str, duration_s: int) -> dict[str, Any]:
    """The generation request body of a clip (the runner adds the shot image's `asset_ids`, which cost nothing)."""
    return {"prompt": prompt, "model": model, "duration_s": duration_s, "aspect_ratio": CLIP_ASPECT}


def vendor_cost(catalog: Catalog, shot: Shot | None) -> Decimal:
    """What the generation a vendor step creates will reserve. A step that is not per shot asks for the model's
    default duration. A request the catalog refuses would fail its step before any reservation: 0."""
    spec = default_model(catalog)
    if spec is None:
        return Decimal(0)
    prompt, duration = (shot.text, shot.duration_s) if shot is not None else ("estimate", spec.default_duration_s)
    try:
        params = normalize(clip_request(spec.model, prompt, duration), catalog)
    except InvalidRequest:
        return Decimal(0)
    return estimate_cost(params, catalog.find(params.model, params.provider))


def local_cost(step_type: StepType, local_credits: Mapping[str, Decimal]) -> Decimal:
    """A local step's configured price (`[workflows] local_step_credits`), 0 by default."""
    return Decimal(local_credits.get(step_type.value, 0))


@dataclass(frozen=True, slots=True)
class StepCost:
    step: str
    type: StepType
    credits: Decimal
    vendor: bool


@dataclass(frozen=True, slots=True)
class CostEstimate:
    steps: tuple[StepCost, ...]

    @property
    def total(self) -> Decimal:
        return sum((s.credits for s in self.steps), Decimal(0))


def shots_of(project_input: Mapping[str, Any]) -> list[Shot]:
    """The shots the plan step will make of this input (none when it will refuse the script)."""
    script = project_input.get("script")
    if not isinstance(script, str) or not script.strip():
        return []
    shots = storyboard(script)
    return shots if len(shots) <= MAX_SHOTS else []


def estimate_project(
    wf: WorkflowDef,
    project_input: Mapping[str, Any],
    catalog: Catalog,
    local_credits: Mapping[str, Decimal],
) -> CostEstimate:
    """Every step instance the project will run, with what it will cost."""
    shots: Sequence[Shot] = shots_of(project_input) if any(s.per_shot for s in wf.steps) else []
    out: list[StepCost] = []
    for step in wf.order():
        vendor = STEP_SPECS[step.type].vendor
        instances: list[tuple[str, Shot | None]] = (
            [(f"{step.key}[{i}]", shot) for i, shot in enumerate(shots)] if step.per_shot else [(step.key, None)]
        )
        for key, shot in instances:
            credits = vendor_cost(catalog, shot) if vendor else local_cost(step.type, local_credits)
            out.append(StepCost(key, step.type, credits, vendor))
    return CostEstimate(tuple(out))
