"""Generation requests, pure: validation against the model catalog, normalization, hashing, cost estimate.

The request hash is taken over the *normalized* parameters — defaults filled in, keys sorted, the prompt in
Unicode NFC — so the same request sent with keys in another order, or with defaults spelled out, is the same
request for idempotency (request_hash excludes trace ids and field order).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from aivedio_engine.domain.references import ASPECT_RATIOS, LimitExceeded, ModelLimits, check_shape

MAX_PROMPT_CHARS = 4000
MAX_ASSETS = 8
#: a request's `priority` is the tier it asks to be served in (1 first... 5 cleanup; 0 or absent =
#: its tenant's tier); it can never be better than its tenant's tier (`admission.capped_tier`)
PRIORITY_RANGE = (0, 5)
SEED_MAX = 2**31 - 1
MIN_DEADLINE_S = 10
#: outputs one request may ask for (`n`); a model allows at most its own `max_outputs`
MAX_OUTPUTS = 4


class InvalidRequest(ValueError):
    """A parameter is unknown or out of range; `field` names it for the 422 problem."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    provider: str
    model: str
    max_duration_s: int
    resolutions: tuple[str, ...]
    price_per_second: Mapping[str, Decimal]
    default_duration_s: int = 5
    #: what the provider's adapter says this model accepts (references, durations, aspect ratios)
    limits: ModelLimits = field(default_factory=ModelLimits)
    #: outputs (variants) one request may ask for (`n`)
    max_outputs: int = 1


@dataclass(frozen=True, slots=True)
class Catalog:
    models: tuple[ModelSpec, ...]
    default_provider: str
    default_deadline_s: int
    max_deadline_s: int = 7 * 24 * 3600

    def find(self, model: str, provider: str | None) -> ModelSpec:
        matches = [m for m in self.models if m.model == model and (provider is None or m.provider == provider)]
        if not matches:
            offering = sorted({m.provider for m in self.models if m.model == model})
            if provider is not None and offering:
                raise InvalidRequest(
                    "provider",
                    f"provider {provider!r} does not offer model {model!r} (offered by: {', '.join(offering)})",
                )
            raise InvalidRequest("model", f"unknown model {model!r} (known: {self.known_models()})")
        preferred = [m for m in matches if m.provider == self.default_provider]
        return (preferred or matches)[0]

    def known_models(self) -> str:
        """The models that can be requested, for an error message: "a, b" or "none configured"."""
        return ", ".join(sorted({m.model for m in self.models})) or "none configured"


@dataclass(frozen=True, slots=True)
class GenerationParams:
    prompt: str
    model: str
    provider: str
    duration_s: int
    aspect_ratio: str
    resolution: str
    priority: int
    deadline_s: int
    seed: int | None = None
    asset_ids: tuple[str, ...] = field(default=())
    #: outputs (variants) asked for
    n: int = 1

    def canonical(self) -> dict[str, Any]:
        # every field is a scalar or a tuple of strings, so a shallow copy is what `asdict` (a deep copy, ~5 % of
        # the API's CPU per create under py-spy) gave
        data = {name: getattr(self, name) for name in _PARAM_FIELDS}
        data["asset_ids"] = list(self.asset_ids)
        if self.n == 1:  # absent means one: a single-output request keeps the hash it had before `n` existed
            del data["n"]
        return data


_PARAM_FIELDS = tuple(f.name for f in fields(GenerationParams))

_FIELDS = {
    "prompt",
    "model",
    "provider",
    "asset_ids",
    "duration_s",
    "aspect_ratio",
    "resolution",
    "seed",
    "priority",
    "deadline_s",
    "n",
}


def normalize(raw: Mapping[str, Any], catalog: Catalog) -> GenerationParams:
    unknown = set(raw) - _FIELDS
    if unknown:
        raise InvalidRequest(sorted(unknown)[0], "unknown field")
    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidRequest("prompt", "a non-empty string is required")
    prompt = unicodedata.normalize("NFC", prompt.strip())
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidRequest("prompt", f"at most {MAX_PROMPT_CHARS} characters")
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model", "a model name is required")
    provider = raw.get("provider")
    if provider is not None and not isinstance(provider, str):
        raise InvalidRequest("provider", "must be a string")
    spec = catalog.find(model, provider)

    duration = _int(raw, "duration_s", spec.default_duration_s, 1, spec.max_duration_s)
    resolution = raw.get("resolution", spec.resolutions[0])
    if resolution not in spec.resolutions:
        raise InvalidRequest("resolution", f"must be one of {', '.join(spec.resolutions)}")
    aspect = raw.get("aspect_ratio", (spec.limits.aspect_ratios or ASPECT_RATIOS)[0])
    if aspect not in ASPECT_RATIOS:
        raise InvalidRequest("aspect_ratio", f"must be one of {', '.join(ASPECT_RATIOS)}")
    try:
        check_shape(spec.model, spec.limits, spec.max_duration_s, duration, aspect)
    except LimitExceeded as exc:
        raise InvalidRequest(exc.field, str(exc)) from None
    seed = raw.get("seed")
    if seed is not None:
        seed = _int(raw, "seed", 0, 0, SEED_MAX)
    n = _int(raw, "n", 1, 1, MAX_OUTPUTS)
    if n > spec.max_outputs:
        raise InvalidRequest(
            "n", f"model {spec.model!r} on provider {spec.provider!r} makes at most {spec.max_outputs} output(s)"
        )
    return GenerationParams(
        prompt=prompt,
        model=spec.model,
        provider=spec.provider,
        duration_s=duration,
        aspect_ratio=aspect,
        resolution=resolution,
        priority=_int(raw, "priority", 0, *PRIORITY_RANGE),
        deadline_s=_int(raw, "deadline_s", catalog.default_deadline_s, MIN_DEADLINE_S, catalog.max_deadline_s),
        seed=seed,
        asset_ids=_asset_ids(raw.get("asset_ids")),
        n=n,
    )


def _int(raw: Mapping[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise InvalidRequest(name, "must be an integer")
    if not lo <= value <= hi:
        raise InvalidRequest(name, f"must be between {lo} and {hi}")
    return int(value)


def _asset_ids(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_ASSETS:
        raise InvalidRequest("asset_ids", f"a list of at most {MAX_ASSETS} asset ids")
    out: list[str] = []
    for item in value:
        try:
            canonical = str(uuid.UUID(str(item)))
        except ValueError:
            raise InvalidRequest("asset_ids", f"not an asset id: {str(item)[:64]!r}") from None
        if canonical not in out:  # order matters (first image leads), repeats do not
            out.append(canonical)
    return tuple(out)


def request_hash(params: GenerationParams) -> bytes:
    canonical = json.dumps(params.canonical(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).digest()


def estimate_cost(params: GenerationParams, spec: ModelSpec) -> Decimal:
    price = spec.price_per_second[params.resolution]
    return (price * params.duration_s * params.n).quantize(Decimal("0.00000001"), rounding=ROUND_HALF_UP)
