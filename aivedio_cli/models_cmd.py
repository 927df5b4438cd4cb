"""`aivedio models list`: what can be requested — provider, model, durations, resolutions, aspect ratios,
references (how many images and videos, how large), prices.

Embedded (no `--api-url`) it is the catalog of this machine's settings; with `--api-url` it is `GET /v1/models`
of that server.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from aivedio_cli._context import state
from aivedio_cli._params import complete_provider
from aivedio_cli._render import ExitCode, emit_json, fail
from aivedio_cli.generations_cmd import API_KEY, API_URL, JSON, client_failed

app = typer.Typer(help="The models generations can use.", no_args_is_help=True)


def _models(ctx: typer.Context, api_url: str | None, api_key: str | None) -> list[dict[str, Any]]:
    from aivedio_engine.client import ClientError, RemoteClient
    from aivedio_engine.services.catalog import build_catalog, describe_models

    if not api_url:  # the catalog is settings only: no database, nothing created
        return describe_models(build_catalog(state(ctx).settings()))
    if not api_key:
        fail("--api-url needs --api-key (or AIVEDIO_API_KEY)", ExitCode.USAGE)
    client = RemoteClient(api_url, api_key)
    try:
        return client.models()
    except ClientError as exc:
        client_failed(exc)
    finally:
        client.close()


@app.command("list")
def list_models(
    ctx: typer.Context,
    provider: str | None = typer.Option(
        None, "--provider", autocompletion=complete_provider, help="Only this provider's models."
    ),
    as_json: bool = JSON,
    api_url: str | None = API_URL,
    api_key: str | None = API_KEY,
) -> None:
    """List the models with their limits and prices (credits per second of video, by resolution)."""
    models = _models(ctx, api_url, api_key)
    if provider is not None:
        known = sorted({str(m["provider"]) for m in models})
        if provider not in known:
            fail(f"unknown provider {provider!r} (known: {', '.join(known) or 'none configured'})", ExitCode.USAGE)
        models = [m for m in models if m["provider"] == provider]
    if as_json:
        emit_json({"data": models})
        return
    table = Table()
    for column in ("provider", "model", "duration (s)", "resolutions", "aspect ratios", "references", "price / s"):
        table.add_column(column)
    for m in models:
        prices = ", ".join(f"{r}: {p}" for r, p in dict(m.get("price_per_second") or {}).items())
        limits = dict(m.get("limits") or {})
        table.add_row(
            str(m["provider"]),
            str(m["model"]),
            _durations(m, limits),
            ", ".join(m.get("resolutions") or []),
            ", ".join(m.get("aspect_ratios") or []),
            _references(limits),
            prices,
        )
    console = Console(file=sys.stdout, soft_wrap=True)
    (console if console.is_terminal else Console(file=sys.stdout, width=200)).print(table)
    if not models:
        print("no models are configured (see [providers] in aivedio.toml)", file=sys.stderr)


def _durations(model: dict[str, Any], limits: dict[str, Any]) -> str:
    allowed = limits.get("durations_s")
    if allowed:
        return f"{', '.join(str(d) for d in allowed)} (default {model.get('default_duration_s')})"
    return f"{model.get('default_duration_s')} (max {model.get('max_duration_s')})"


def _references(limits: dict[str, Any]) -> str:
    """ "≤ 1 image (16 MB), ≤ 1 video (32 MB), video required" — or "?" from a server that predates limits."""
    if not limits:
        return "?"
    mb = 1024 * 1024
    images, videos = int(limits.get("max_reference_images", 0)), int(limits.get("max_reference_videos", 0))
    parts = [
        f"≤ {images} image{'s' if images > 1 else ''} ({int(limits.get('max_image_bytes', 0)) // mb} MB)"
        if images
        else "no image"
    ]
    parts.append(
        f"≤ {videos} video{'s' if videos > 1 else ''} ({int(limits.get('max_video_bytes', 0)) // mb} MB)"
        if videos
        else "no video"
    )
    if limits.get("min_reference_videos"):
        parts.append("video required")
    return ", ".join(parts)
