"""The OpenAPI document states this deployment's real constraints: which models, providers, resolutions and
durations a request may name (from the configured catalog), and how operations link (a created generation is
read, followed and canceled by the id in the 202). Clients generate forms from it, and the schema-driven
fuzzer reaches past validation into the paths behind it instead of bouncing off 422s.

The route models keep the static bounds (api/validation.py); only what depends on the configuration is
filled in here, once, when the document is first asked for.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from aivedio_engine.domain.references import ASPECT_RATIOS
from aivedio_engine.domain.requests import Catalog

#: (operation, status) → links: the id a 201/202 returns is the path parameter of the operations on that object
_LINKS = {
    ("/v1/generations", "post", "202"): {
        "GetGeneration": ("/v1/generations/{task_id}", "get", "task_id"),
        "CancelGeneration": ("/v1/generations/{task_id}/cancel", "post", "task_id"),
    },
    ("/v1/assets", "post", "201"): {
        "GetAsset": ("/v1/assets/{asset_id}", "get", "asset_id"),
        "CompleteAsset": ("/v1/assets/{asset_id}/complete", "post", "asset_id"),
    },
}


#: headers the service requires (a missing one is its 400, not FastAPI's 422, so the route declares them optional)
_REQUIRED_HEADERS = {("/v1/generations", "post"): "Idempotency-Key"}


def install(app: FastAPI, catalog: Catalog) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            describe(doc, catalog)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def describe(doc: dict[str, Any], catalog: Catalog) -> None:
    """Narrow the generic request schema (and the callback's provider) to `catalog`; parameters are never null;
    add the links between operations."""
    props = doc.get("components", {}).get("schemas", {}).get("GenerationRequest", {}).get("properties", {})
    if props and catalog.models:
        _narrow(props.get("model"), enum=sorted({m.model for m in catalog.models}))
        _narrow(props.get("provider"), enum=sorted({m.provider for m in catalog.models}))
        _narrow(props.get("resolution"), enum=sorted({r for m in catalog.models for r in m.resolutions}))
        _narrow(props.get("aspect_ratio"), enum=list(ASPECT_RATIOS))
        _narrow(props.get("duration_s"), maximum=max(m.max_duration_s for m in catalog.models))
        _narrow(props.get("deadline_s"), maximum=catalog.max_deadline_s)
    paths = doc.get("paths", {})
    for param in paths.get("/v1/callbacks/{provider}", {}).get("post", {}).get("parameters", []):
        if param.get("name") == "provider" and catalog.models:
            _narrow(param.get("schema"), enum=sorted({m.provider for m in catalog.models}))
    for operation in (op for item in paths.values() for op in item.values() if isinstance(op, dict)):
        for param in operation.get("parameters", []):
            _not_null(param.get("schema"))
    for (path, method), name in _REQUIRED_HEADERS.items():
        for param in paths.get(path, {}).get(method, {}).get("parameters", []):
            if param.get("in") == "header" and param.get("name") == name:
                param["required"] = True
    for (path, method, status), targets in _LINKS.items():
        response = paths.get(path, {}).get(method, {}).get("responses", {}).get(status)
        links = {
            name: {"operationId": target["operationId"], "parameters": {param: "$response.body#/id"}}
            for name, (target_path, target_method, param) in targets.items()
            if "operationId" in (target := paths.get(target_path, {}).get(target_method, {}))
        }
        if response is not None and links:
            response["links"] = links


def _not_null(schema: dict[str, Any] | None) -> None:
    """An optional parameter is absent, never null (HTTP has no null): `anyOf [X, null]` + extras → X + extras."""
    branches = schema.get("anyOf") if schema else None
    if schema is None or not branches:
        return
    kept = [b for b in branches if b.get("type") != "null"]
    if len(kept) == 1:
        del schema["anyOf"]
        schema.update({k: v for k, v in kept[0].items() if k not in schema})


def _narrow(prop: dict[str, Any] | None, **constraints: Any) -> None:
    """Add constraints to a property, or to the non-null branch of an optional one."""
    if prop is None:
        return
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") != "null":
            branch.update(constraints)
