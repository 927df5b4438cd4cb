"""The model catalog (what can be requested, and its price), built from the providers in Settings."""

from __future__ import annotations

from aivedio_engine.config import ModelSettings, Settings
from aivedio_engine.domain.references import ModelLimits, default_duration
from aivedio_engine.domain.requests import Catalog, ModelSpec
from aivedio_engine.providers.registry import model_limits


def build_catalog(settings: Settings) -> Catalog:
    models = tuple(
        _spec(name, model_name, model, model_limits(provider, model_name))
        for name, provider in settings.providers.items()
        if provider.enabled
        for model_name, model in provider.models.items()
    )
    return Catalog(
        models=models,
        default_provider=settings.default_provider,
        default_deadline_s=settings.limits.default_deadline_s,
    )


def _spec(provider: str, name: str, model: ModelSettings, limits: ModelLimits) -> ModelSpec:
    return ModelSpec(
        provider=provider,
        model=name,
        max_duration_s=model.max_duration_s,
        resolutions=tuple(model.resolutions),
        price_per_second=dict(model.price_per_second),
        default_duration_s=default_duration(limits, model.max_duration_s),
        limits=limits,
        # the configured maximum, but never more than the adapter can make (vendor adapters: one)
        max_outputs=min(model.max_outputs, limits.max_outputs),
    )


def describe_models(catalog: Catalog) -> list[dict[str, object]]:
    """Each model a client may request, with its limits and prices (`GET /v1/models`, `aivedio models list`)."""
    return [
        {
            "provider": m.provider,
            "model": m.model,
            "max_duration_s": m.max_duration_s,
            "default_duration_s": m.default_duration_s,
            "resolutions": list(m.resolutions),
            "aspect_ratios": list(m.limits.aspect_ratios),
            "price_per_second": {r: str(p) for r, p in m.price_per_second.items()},
            "max_outputs": m.max_outputs,
            "limits": m.limits.describe(m.max_duration_s),
        }
        for m in catalog.models
    ]
