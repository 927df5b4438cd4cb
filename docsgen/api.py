"""The HTTP API reference, from the OpenAPI document the app itself serves (`GET /openapi.json`), with the notes
and curl examples of docsgen/api_examples.py. The app is built on the model's default settings (no file, no
environment), so the narrowed enums (models, providers, resolutions) are those of the built-in `local` provider."""

from __future__ import annotations

import json
import re
from typing import Any

from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import build_context
from docsgen import DocsError
from docsgen.api_examples import AUTH, BASE, EXAMPLES
from docsgen.configuration import _Defaults

#: operations that take no API key
_PUBLIC = re.compile(r"^(/healthz|/readyz|/v1/callbacks/|/v1/uploads/|/v1/objects/|/v1/playback/)")


def openapi_document() -> dict[str, Any]:
    context = build_context(_Defaults())
    try:
        return create_app(context).openapi()
    finally:
        context.close()


def render() -> str:
    doc = openapi_document()
    operations = [
        (f"{method.upper()} {path}", op)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if isinstance(op, dict)
    ]
    unknown = sorted(set(EXAMPLES) - {key for key, _ in operations})
    if unknown:
        raise DocsError(f"docsgen/api_examples.py names operations the API does not have: {', '.join(unknown)}")
    out = ["| operation | summary |", "|---|---|"]
    out += [f"| [`{key}`](#{_anchor(key)}) | {_summary(op)} |" for key, op in operations]
    out.append("")
    tag = None
    for key, op in operations:
        if op.get("tags", [None])[0] != tag:
            tag = op.get("tags", [None])[0]
            out += [f"### {str(tag).capitalize()}", ""]
        out += _operation(key, op)
    out += ["### Schemas", ""]
    for name, schema in doc.get("components", {}).get("schemas", {}).items():
        out += _schema(name, schema)
    return "\n".join(out)


def _operation(key: str, op: dict[str, Any]) -> list[str]:
    method, path = key.split(" ", 1)
    notes, example = EXAMPLES.get(key, ("", _default_example(method, path)))
    out = [f"#### `{key}`", "", " ".join(op.get("description", "").split()) or _summary(op) + "."]
    if notes:
        out += ["", notes]
    out.append("")
    params = op.get("parameters", [])
    if params:
        out += ["| parameter | in | required | type | description |", "|---|---|---|---|---|"]
        for p in params:
            schema = p.get("schema", {})
            out.append(
                _cells(
                    f"`{p['name']}`",
                    p.get("in", ""),
                    "yes" if p.get("required") else "no",
                    _type(schema),
                    p.get("description", "") or schema.get("description", ""),
                )
            )
        out.append("")
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            out += [f"Request body ({media}): {_type(content.get('schema', {}))}.", ""]
    responses = [f"`{code}` {_response(r)}" for code, r in op.get("responses", {}).items()]
    out += ["Responses: " + "; ".join(responses) + ".", ""]
    out += ["```bash", example, "```", ""]
    return out


def _response(response: dict[str, Any]) -> str:
    contents: list[dict[str, Any]] = list(response.get("content", {}).values())
    schema = contents[0].get("schema", {}) if contents else {}
    return _type(schema) or str(response.get("description", ""))


def _default_example(method: str, path: str) -> str:
    url = re.sub(r"\{(\w+)\}", lambda m: "$" + m.group(1).upper(), path)
    auth = "" if _PUBLIC.match(path) else f" {AUTH}"
    verb = "" if method == "GET" else f" -X {method}"
    return f"curl -s{verb}{auth} {BASE}{url}"


def _summary(op: dict[str, Any]) -> str:
    return str(op.get("summary", ""))


def _anchor(key: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", key.lower()).replace(" ", "-")


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    out = [f"#### `{name}`", ""]
    if schema.get("description"):
        out += [" ".join(schema["description"].split()), ""]
    props = schema.get("properties", {})
    if not props:
        return [*out, _type(schema) or "(no properties)", ""]
    required = set(schema.get("required", []))
    described = any(prop.get("description") for prop in props.values())
    out += ["| field | type | required |" + (" description |" * described), "|---|---|---|" + ("---|" * described)]
    for field, prop in props.items():
        cells = [f"`{field}`", _type(prop), "yes" if field in required else "no"]
        out.append(_cells(*cells, *([prop.get("description", "")] if described else [])))
    return [*out, ""]


def _type(schema: dict[str, Any]) -> str:
    """A schema in a few words: `Ref`, string (≤ 64 chars), one of "a" | "b", list of X, X or null."""
    if not schema:
        return ""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        base = "one of " + " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in schema["enum"])
    elif schema.get("type") == "array":
        base = f"list of {_type(schema.get('items', {})) or 'any'}"
    elif schema.get("type") == "object" and "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        base = f"object of {_type(extra) if isinstance(extra, dict) else 'any'}"
    else:
        base = str(schema.get("type", "any"))
    bounds = [
        f"{label} {_number(schema[k])}"
        for k, label in (
            ("minimum", "≥"),
            ("exclusiveMinimum", ">"),
            ("maximum", "≤"),
            ("exclusiveMaximum", "<"),
            ("minLength", "length ≥"),
            ("maxLength", "length ≤"),
            ("minItems", "items ≥"),
            ("maxItems", "items ≤"),
        )
        if k in schema
    ]
    if schema.get("format"):
        bounds.insert(0, str(schema["format"]))
    if "default" in schema and schema["default"] is not None:
        bounds.append(f"default {json.dumps(schema['default'])}")
    return f"{base} ({', '.join(bounds)})" if bounds else base


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _cells(*cells: str) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
