"""References reach each vendor in its own fields, within its own per-model limits.

Each `fixtures/<vendor>/request_*.json` is the request the vendor documents for that case (method, path, JSON
body), written from the source its `_source` names; the adapter's outgoing request must equal it. A request that
breaks the model's limits is refused before anything is sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from aivedio_engine.domain.references import MB
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.httpclient import HttpClient
from aivedio_engine.providers import fal, kling, replicate, runway
from aivedio_engine.providers.base import Accepted, GenerationRequest, Provider, Rejected
from aivedio_engine.providers.fal import FalProvider
from aivedio_engine.providers.kling import KlingProvider
from aivedio_engine.providers.replicate import ReplicateProvider
from aivedio_engine.providers.runway import RunwayProvider
from tests.support.vendors import FAL_PUBLIC, KEY, KLING_SECRET, RUNWAY_SECRET, FixedClock, fixture, reply
from tests.support.vendors import settings as provider_settings

IMG1 = "https://store.example/refs/first.png?X-Amz-Signature=abc"
IMG2 = "https://store.example/refs/last.png?X-Amz-Signature=def"
VID = "https://store.example/refs/source.mp4?X-Amz-Signature=ghi"

MAKERS: dict[str, Callable[[str, HttpClient], Provider]] = {
    "runway": lambda m, http: RunwayProvider("runway", provider_settings("runway", m, "rw_key", [RUNWAY_SECRET]), http),
    "replicate": lambda m, http: ReplicateProvider("replicate", provider_settings("replicate", m, "r8_key", []), http),
    "fal": lambda m, http: FalProvider("fal", provider_settings("fal", m, "fal_key", [FAL_PUBLIC]), http),
    "kling": lambda m, http: KlingProvider(
        "kling", provider_settings("kling", m, "ak_test:sk_test", [KLING_SECRET]), http, clock=FixedClock()
    ),
}


def send(vendor: str, model: str, **fields: Any) -> tuple[Any, list[httpx.Request]]:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return reply(fixture(vendor, "submit_accepted"))

    http = HttpClient(base_url=f"https://{vendor}.test", transport=httpx.MockTransport(handler))
    base: dict[str, Any] = {
        "prompt": "a red fox in snow",
        "model": model,
        "duration_s": 5,
        "resolution": "720p",
        "aspect_ratio": "16:9",
    }
    request = GenerationRequest(**{**base, **fields})
    return MAKERS[vendor](model, http).submit(request, KEY), calls


# (vendor, model, request fields, recorded request fixture)
MAPPED = [
    ("runway", "gen4_turbo", {"reference_urls": [IMG1]}, "request_image_to_video"),
    (
        "runway",
        "gen3a_turbo",
        {"reference_urls": [IMG1, IMG2], "aspect_ratio": "9:16", "duration_s": 10},
        "request_first_last_frame",
    ),
    ("runway", "gen4_aleph", {"reference_urls": [IMG1], "reference_video_urls": [VID]}, "request_video_to_video"),
    ("replicate", "acme/video-model", {"reference_urls": [IMG1]}, "request_image"),
    ("replicate", "google/veo-3.1", {"reference_urls": [IMG1, IMG2], "duration_s": 8}, "request_first_last_frame"),
    (
        "replicate",
        "runwayml/gen4-aleph",
        {"reference_urls": [IMG1], "reference_video_urls": [VID]},
        "request_video_to_video",
    ),
    (
        "fal",
        "fal-ai/kling-video/v1.6/pro/image-to-video",
        {"reference_urls": [IMG1, IMG2], "duration_s": 10},
        "request_first_last_frame",
    ),
    (
        "fal",
        "fal-ai/veo3/image-to-video",
        {"reference_urls": [IMG1], "duration_s": 8, "aspect_ratio": "9:16"},
        "request_veo_image",
    ),
    ("fal", "fal-ai/wan/v2.2-a14b/video-to-video", {"reference_video_urls": [VID]}, "request_video_to_video"),
    ("kling", "kling-v1-6", {"reference_urls": [IMG1, IMG2]}, "request_first_last_frame"),
]


@pytest.mark.parametrize(
    ("vendor", "model", "fields", "recorded"), MAPPED, ids=lambda x: x if isinstance(x, str) else ""
)
def test_references_reach_the_vendors_own_fields(
    vendor: str, model: str, fields: dict[str, Any], recorded: str
) -> None:
    result, calls = send(vendor, model, **fields)
    assert isinstance(result, Accepted), result
    (sent,) = calls
    expected = fixture(vendor, recorded)
    assert (sent.method, sent.url.path) == (expected["method"], expected["path"])
    assert json.loads(sent.content) == expected["body"]
    # the signed URLs go out exactly as minted: nothing re-encodes or truncates them
    for url in [*fields.get("reference_urls", []), *fields.get("reference_video_urls", [])]:
        assert url in sent.content.decode()


# (vendor, model, request fields, the limit the refusal names)
REFUSED = [
    (
        "runway",
        "gen4_turbo",
        {"reference_urls": [IMG1, IMG2]},
        "model gen4_turbo accepts at most 1 reference image (got 2)",
    ),
    ("runway", "gen4_turbo", {"reference_video_urls": [VID]}, "model gen4_turbo accepts no reference video (got 1)"),
    ("runway", "veo3", {"duration_s": 5}, "duration 5 s not allowed for veo3 (allowed: 4, 6, 8)"),
    ("runway", "gen3a_turbo", {"aspect_ratio": "1:1"}, "aspect ratio 1:1 not allowed for gen3a_turbo"),
    ("runway", "gen4_aleph", {"reference_urls": [IMG1]}, "model gen4_aleph needs at least 1 reference video"),
    ("replicate", "acme/video-model", {"reference_video_urls": [VID]}, "accepts no reference video (got 1)"),
    ("replicate", "google/veo-3", {"duration_s": 5}, "duration 5 s not allowed for google/veo-3 (allowed: 4, 6, 8)"),
    ("fal", "fal-ai/veo3/image-to-video", {"duration_s": 10}, "duration 10 s not allowed"),
    ("fal", "fal-ai/minimax/video-01/image-to-video", {"reference_urls": [IMG1, IMG2]}, "at most 1 reference image"),
    ("kling", "kling-v2-master", {"reference_urls": [IMG1, IMG2]}, "at most 1 reference image (got 2)"),
    ("kling", "kling-v2-master", {"reference_video_urls": [VID]}, "accepts no reference video (got 1)"),
    ("kling", "kling-v2-master", {"duration_s": 7}, "duration 7 s not allowed for kling-v2-master (allowed: 5, 10)"),
]


@pytest.mark.parametrize(("vendor", "model", "fields", "names"), REFUSED, ids=lambda x: x if isinstance(x, str) else "")
def test_a_request_over_the_models_limits_is_refused_before_sending(
    vendor: str, model: str, fields: dict[str, Any], names: str
) -> None:
    result, calls = send(vendor, model, **fields)
    assert isinstance(result, Rejected) and result.error_class is ErrorClass.LOCAL_INVALID
    assert names in (result.message or "") and result.code == "reference_limit"
    assert calls == []  # nothing sent, so nothing billed


@pytest.mark.parametrize(
    ("module", "model", "images", "videos", "image_bytes", "durations", "ratios"),
    [
        (runway, "gen4_turbo", 1, 0, 16 * MB, (5, 10), ("16:9", "9:16", "1:1", "4:3", "3:4", "21:9")),
        (runway, "gen3a_turbo", 2, 0, 16 * MB, (5, 10), ("16:9", "9:16")),
        (runway, "gen4_aleph", 1, 1, 16 * MB, (5,), ("16:9", "9:16", "1:1", "4:3", "3:4", "21:9")),
        (runway, "veo3", 1, 0, 16 * MB, (4, 6, 8), ("16:9", "9:16")),
        (replicate, "google/veo-3:abc123", 1, 0, 10 * MB, (4, 6, 8), ("16:9", "9:16")),
        (fal, "fal-ai/veo3", 1, 0, 8 * MB, (4, 6, 8), ("16:9", "9:16")),
        (fal, "fal-ai/wan/v2.2-a14b/video-to-video", 1, 1, 8 * MB, None, ("16:9", "9:16", "1:1", "4:3", "3:4", "21:9")),
        (kling, "kling-v2-master", 1, 0, 10 * MB, (5, 10), ("16:9", "9:16", "1:1")),
        (kling, "kling-v1-6", 2, 0, 10 * MB, (5, 10), ("16:9", "9:16", "1:1")),
    ],
)
def test_each_adapter_declares_its_per_model_limits(
    module: Any,
    model: str,
    images: int,
    videos: int,
    image_bytes: int,
    durations: tuple[int, ...] | None,
    ratios: tuple[str, ...],
) -> None:
    limits = module.model_limits(model)
    assert (limits.max_reference_images, limits.max_reference_videos, limits.max_image_bytes) == (
        images,
        videos,
        image_bytes,
    )
    assert limits.durations == durations and limits.aspect_ratios == ratios
    # and the adapter's Capabilities carry the same table for its configured models
    vendor = module.__name__.rsplit(".", 1)[-1]
    provider = MAKERS[vendor](model, HttpClient(base_url="https://x.test"))
    assert provider.capabilities.limits_for(model) == limits
