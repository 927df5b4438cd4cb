"""The model catalog (what can be requested, and its price), built from the providers in Settings."""

from __future__ import annotations

from aivedio_engine.config import Settings
from aivedio_engine.domain.requests import ASPECT_RATIOS, Catalog, ModelSpec


def build_catalog(settings: Settings) -> Catalog:
    models = tuple(
        ModelSpec(
            provider=name,
            model=model_name,
            max_duration_s=model.max_duration_s,
            resolutions=tuple(model.resolutions),
            price_per_second=dict(model.price_per_second),
            default_duration_s=min(5, model.max_duration_s),
        )
        for name, provider in settings.providers.items()
        if provider.enabled
        for model_name, model in provider.models.items()
    )
    return Catalog(
        models=models,
        default_provider=settings.default_provider,
        default_deadline_s=settings.limits.default_deadline_s,
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
            "aspect_ratios": list(ASPECT_RATIOS),
            "price_per_second": {r: str(p) for r, p in m.price_per_second.items()},
        }
        for m in catalog.models
    ]
