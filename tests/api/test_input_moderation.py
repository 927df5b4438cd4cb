"""Input moderation (issue 16 item 7 /): `POST /v1/generations` checks the prompt and
the references after validation and before the reservation. A refusal is a 422 `moderation-rejected` that leaves
no task, no ledger row and no outbox row; a warning is accepted and marked for review (the media step then holds
the output: tests/flow/test_media_pipeline.py); a custom moderator plugs in through `moderation.moderator`."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.config import Settings
from aivedio_engine.db.tables import credit_ledger, generation_tasks
from aivedio_engine.domain.moderation import (
    ImageRules,
    ModerationInput,
    ModerationResult,
    ReferenceFacts,
    RuleModerator,
)
from aivedio_engine.domain.status import ModerationVerdict
from tests.support.api_requests import create, nothing_reserved, ready_input
from tests.support.app import TenantKey, make_context, tenant_with_key

BODY = {"prompt": "a red fox running through snow", "model": "local-v1", "duration_s": 2}
MODERATION = {"reject_terms": ["gore", "18+"], "warn_terms": ["snow"], "min_image_side": 64}


@pytest.fixture(params=["embedded", "postgres"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    context = make_context(tmp_path / "data", url, moderation=MODERATION)
    yield context
    context.close()


@pytest.fixture
def client(ctx: AppContext) -> TestClient:
    return TestClient(create_app(ctx))


@pytest.fixture
def alice(ctx: AppContext) -> TenantKey:
    return tenant_with_key(ctx, "alice", credits=100)


def _refused(r: Any, *why: str) -> None:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["type"].endswith("/moderation-rejected")
    for phrase in why:
        assert phrase in body["detail"], body["detail"]


def test_a_refused_prompt_is_422_and_reserves_creates_and_queues_nothing(
    ctx: AppContext, client: TestClient, alice: TenantKey
) -> None:
    _refused(create(client, alice, "k1", {**BODY, "prompt": "GORE in the snow"}), "refused term 'gore'")
    _refused(create(client, alice, "k2", {**BODY, "prompt": "rated 18+ only"}), "'18+'")
    nothing_reserved(ctx, alice)  # no task, no outbox row, no ledger row, the balance untouched
    # the same key with an acceptable prompt is a new request: the refusal stored nothing under it
    ok = create(client, alice, "k1", {**BODY, "prompt": "a gorey category of foxes"})  # whole words only
    assert ok.status_code == 202, ok.text


def test_reference_images_are_held_to_format_and_size_rules(
    ctx: AppContext, client: TestClient, alice: TenantKey
) -> None:
    gif = ready_input(ctx, alice, mime_detected="image/gif", width=640, height=360, size_bytes=1000)
    _refused(create(client, alice, "gif", {**BODY, "asset_ids": [gif]}), "is image/gif, not one of")
    tiny = ready_input(ctx, alice, mime_detected="image/png", width=32, height=360, size_bytes=1000)
    _refused(create(client, alice, "tiny", {**BODY, "asset_ids": [tiny]}), "32x360, a side below 64 px")
    nothing_reserved(ctx, alice)
    fine = ready_input(ctx, alice, mime_detected="image/png", width=640, height=360, size_bytes=1000)
    r = create(client, alice, "fine", {**BODY, "prompt": "a fox", "asset_ids": [fine]})
    assert r.status_code == 202, r.text
    assert "input_review" not in r.json()["params"]


def test_a_warned_prompt_is_accepted_with_its_reasons_kept_for_review(
    ctx: AppContext, client: TestClient, alice: TenantKey
) -> None:
    r = create(client, alice, "w1", BODY)
    assert r.status_code == 202, r.text
    with ctx.engine.connect() as conn:
        task = conn.execute(sa.select(generation_tasks)).one()
        (entry,) = conn.execute(sa.select(credit_ledger.c.entry_type).where(credit_ledger.c.task_id == task.id))
    assert task.params["input_review"] == "prompt contains the review term 'snow'"
    assert entry.entry_type == "RESERVE"  # a normal task: it is reserved, and settled or released as any other
    # outside the request hash: the same request with the same key replays the same task
    again = create(client, alice, "w1", BODY)
    assert again.status_code == 202 and again.json()["id"] == str(task.id)


def test_a_custom_moderator_plugs_in_by_dotted_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ModerationInput] = []

    class RefuseEverything:
        def check(self, request: ModerationInput) -> ModerationResult:
            seen.append(request)
            return ModerationResult(ModerationVerdict.REJECT, ("the vendor said no",))

    def factory(settings: Settings) -> RefuseEverything:
        return RefuseEverything()

    module = types.ModuleType("my_moderation")
    module.factory = factory  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "my_moderation", module)
    context = make_context(tmp_path / "data", moderation={"moderator": "my_moderation:factory"})
    try:
        alice = tenant_with_key(context, "alice", credits=100)
        _refused(create(TestClient(create_app(context)), alice, "k", BODY), "the vendor said no")
        assert [s.prompt for s in seen] == [BODY["prompt"]]
        nothing_reserved(context, alice)
    finally:
        context.close()


# ------------------------------------------------------------------------------------------- the rules, pure

RULES = RuleModerator(["gore"], ["snow", "night sky"], ImageRules(("image/png",), 1000, 16, 100 * 100))


def _ref(**facts: Any) -> ReferenceFacts:
    base: dict[str, Any] = {"asset_id": "a1", "is_video": False, "mime": "image/png", "size_bytes": 10}
    return ReferenceFacts(**{**base, "width": 50, "height": 50, **facts})


def test_rules_reject_before_they_warn_and_name_every_fault() -> None:
    r = RULES.check(ModerationInput("Gore under a night sky", (_ref(size_bytes=5000, width=300),)))
    assert r.verdict is ModerationVerdict.REJECT
    assert r.reasons == (
        "prompt contains the refused term 'gore'",
        "reference a1 is 5000 bytes, more than 1000",
        "reference a1 is 300x50, more than 10000 pixels",
    )
    w = RULES.check(ModerationInput("snow under a NIGHT SKY", (_ref(),)))
    assert w.verdict is ModerationVerdict.WARN
    assert w.reasons == ("prompt contains the review term 'snow'", "prompt contains the review term 'night sky'")
    assert RULES.check(ModerationInput("snowy gorey", ())).verdict is ModerationVerdict.ALLOW


def test_unmeasured_facts_and_videos_are_not_held_against_a_request() -> None:
    unmeasured = _ref(mime=None, size_bytes=None, width=None, height=None)
    video = _ref(is_video=True, mime="video/mp4", size_bytes=10**9)
    assert RULES.check(ModerationInput("a fox", (unmeasured, video))).verdict is ModerationVerdict.ALLOW
