"""`list_jobs` of the vendor adapters: Replicate's documented predictions list, Unsupported everywhere else.

Replicate's list shape (`{next, previous, results}`, 100 a page, newest first, `created_after`/`created_before`
in ISO 8601) is from replicate-python-stainless `resources/predictions.py` (`list`) and `pagination.py`, which
are generated from Replicate's OpenAPI spec.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
from pydantic import SecretStr

from aivedio_engine.config import ModelSettings, ProviderSettings
from aivedio_engine.httpclient import HttpClient
from aivedio_engine.providers.base import JobStatus, QueryFailed, Unsupported
from aivedio_engine.providers.fal import FalProvider
from aivedio_engine.providers.fingerprint import request_fingerprint
from aivedio_engine.providers.kling import KlingProvider
from aivedio_engine.providers.replicate import ReplicateProvider
from aivedio_engine.providers.runway import RunwayProvider

AFTER = datetime(2026, 7, 1, 11, 57, 30, tzinfo=UTC)
BEFORE = AFTER + timedelta(seconds=150)
MODEL = "acme/video-model"
VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"
OURS = {
    "prompt": "a red fox in snow",
    "model": MODEL,
    "duration_s": 5,
    "resolution": "720p",
    "aspect_ratio": "16:9",
    "seed": None,
}


def prediction(
    pid: str,
    created: datetime,
    status: str = "processing",
    model: str = MODEL,
    inp: dict[str, Any] | None = None,
    data_removed: bool = False,
) -> dict[str, Any]:
    return {
        "id": pid,
        "model": model,
        "version": VERSION,
        "status": status,
        "source": "api",
        "created_at": created.isoformat().replace("+00:00", "Z"),
        "started_at": None,
        "completed_at": None,
        "input": {"prompt": "a red fox in snow", "duration": 5, "aspect_ratio": "16:9", "resolution": "720p"}
        if inp is None
        else inp,
        "output": None,
        "error": None,
        "data_removed": data_removed,
        "urls": {"get": f"https://api.replicate.com/v1/predictions/{pid}"},
    }


def settings(model: str = MODEL, **extra: Any) -> ProviderSettings:
    return ProviderSettings(
        adapter="replicate",
        base_url="https://replicate.test",
        api_key=SecretStr("r8_key"),
        models={model: ModelSettings(max_duration_s=10, resolutions=["720p"], price_per_second={"720p": Decimal(1)})},
        **extra,
    )


def replicate(pages: list[Any], model: str = MODEL) -> tuple[ReplicateProvider, list[httpx.Request]]:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        page = pages[len(calls) - 1]
        if isinstance(page, httpx.Response):
            return page
        return httpx.Response(200, content=json.dumps(page).encode())

    http = HttpClient(base_url="https://replicate.test", transport=httpx.MockTransport(handler))
    return ReplicateProvider("replicate", settings(model), http), calls


def test_replicate_lists_every_page_with_the_created_filters() -> None:
    t = AFTER + timedelta(seconds=30)
    page1 = {
        "next": "https://replicate.test/v1/predictions?cursor=cD0yMDI2",
        "previous": None,
        "results": [prediction("p3", t + timedelta(seconds=2)), prediction("p2", t, status="succeeded")],
    }
    page2 = {
        "next": None,
        "previous": "https://replicate.test/v1/predictions?cursor=x",
        "results": [prediction("p1", t - timedelta(seconds=5), status="starting")],
    }
    provider, calls = replicate([page1, page2])
    jobs = provider.list_jobs(AFTER, BEFORE)
    assert isinstance(jobs, list)
    assert [(j.job_id, j.status) for j in jobs] == [
        ("p3", JobStatus.RUNNING),
        ("p2", JobStatus.SUCCEEDED),
        ("p1", JobStatus.QUEUED),
    ]
    assert all(j.fingerprint == request_fingerprint(OURS) for j in jobs)
    assert jobs[1].created_at == t
    first, second = (parse_qs(urlsplit(str(c.url)).query) for c in calls)
    assert [c.url.path for c in calls] == ["/v1/predictions", "/v1/predictions"]
    assert first == {"created_after": ["2026-07-01T11:57:30Z"], "created_before": ["2026-07-01T12:00:00Z"]}
    assert second == {**first, "cursor": ["cD0yMDI2"]}  # filters sent again with the page cursor
    assert all(c.headers["authorization"] == "Bearer r8_key" for c in calls)


def test_replicate_fingerprints_what_we_would_have_sent() -> None:
    t = AFTER + timedelta(seconds=10)
    page = {
        "next": None,
        "results": [
            prediction(
                "seeded",
                t,
                inp={
                    "prompt": "a red fox in snow",
                    "duration": 5,
                    "aspect_ratio": "16:9",
                    "resolution": "720p",
                    "seed": 7,
                    "image": "https://cdn/x.png",
                },
            ),
            prediction("removed", t, inp={}, data_removed=True),
            prediction("playground", t, model="someone/image-model", inp={"prompt": "a cat"}),
            prediction("outside", BEFORE + timedelta(seconds=1)),  # a vendor ignoring the filter is filtered here
        ],
    }
    provider, _ = replicate([page])
    jobs = {j.job_id: j for j in provider.list_jobs(AFTER, BEFORE)}  # type: ignore[union-attr]
    assert set(jobs) == {"seeded", "removed", "playground"}
    assert jobs["seeded"].fingerprint == request_fingerprint({**OURS, "seed": 7})
    assert jobs["removed"].fingerprint is None  # one of our models, input gone: could be ours
    assert jobs["playground"].fingerprint not in (None, request_fingerprint(OURS))  # certainly not ours


def test_replicate_model_with_a_version_is_matched_as_sent() -> None:
    provider, _ = replicate([{"next": None, "results": [prediction("p", AFTER)]}], model=f"{MODEL}:{VERSION}")
    [job] = provider.list_jobs(AFTER, BEFORE)  # type: ignore[misc]
    assert job.fingerprint == request_fingerprint({**OURS, "model": f"{MODEL}:{VERSION}"})


def test_replicate_incomplete_or_odd_listings_fail_rather_than_prove_absence() -> None:
    foreign = {"next": "https://evil.example/v1/predictions?cursor=abc", "results": []}
    cases = [
        [httpx.Response(500, content=b"{}")],
        [httpx.Response(401, content=b'{"detail": "Unauthenticated"}')],
        [{"detail": "not a list"}],
        [{"next": None, "results": [{"id": "p", "status": "weird", "created_at": "2026-07-01T11:58:00Z"}]}],
        [{"next": None, "results": [{"status": "starting", "created_at": "2026-07-01T11:58:00Z"}]}],
        [foreign],  # our API token never follows a page link to another host
        [{"next": "/v1/predictions?cursor=again", "results": []}] * 60,
    ]
    for pages in cases:
        provider, _ = replicate(pages)
        assert isinstance(provider.list_jobs(AFTER, BEFORE), QueryFailed), pages[0]


def test_vendors_without_a_documented_listing_say_unsupported() -> None:
    def boom(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"no call expected: {request.url}")

    http = HttpClient(base_url="https://x.test", transport=httpx.MockTransport(boom))
    for cls, adapter, model, key in [
        (RunwayProvider, "runway", "gen4_turbo", "k"),
        (FalProvider, "fal", "fal-ai/kling-video/v2/master/text-to-video", "k"),
        (KlingProvider, "kling", "kling-v2-master", "ak:sk"),
    ]:
        s = ProviderSettings(
            adapter=adapter,
            base_url="https://x.test",
            api_key=SecretStr(key),
            models={
                model: ModelSettings(max_duration_s=10, resolutions=["720p"], price_per_second={"720p": Decimal(1)})
            },
        )
        assert cls(adapter, s, http).list_jobs(AFTER, BEFORE) == Unsupported()
