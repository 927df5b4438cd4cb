"""WorkflowService's "project changed" signal: sent once the commit returned, for every project a transaction
moved, never for one that rolled back; and through Redis from one process's service to another's stream latch
(the distributed path of `GET /v1/projects/{id}/events`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.notify import RedisNotifier, Subscription
from aivedio_engine.services.errors import IllegalState
from aivedio_engine.services.workflows import WorkflowService
from tests.support.app import make_context, tenant_with_key
from tests.support.redis import REDIS_URL, private_prefix


class Recording:
    """A notifier that records what was published and checks the change was already committed."""

    def __init__(self, svc: Any = None) -> None:
        self.published: list[uuid.UUID] = []
        self.svc: WorkflowService | None = svc
        self.seen_seq: list[int] = []

    def publish(self, task_id: uuid.UUID, version: int) -> None:
        self.published.append(task_id)
        if self.svc is not None:  # read from another connection: the commit is visible already
            self.seen_seq.append(self.svc.get(task_id).project.event_seq)

    def subscribe(self, task_id: uuid.UUID) -> Subscription:
        raise NotImplementedError

    def subscribers(self, task_id: uuid.UUID | None = None) -> int:
        return 0

    def close(self) -> None:
        pass


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[AppContext]:
    context = make_context(tmp_path / "data")
    yield context
    context.close()


def test_signals_follow_commits_only(ctx: AppContext) -> None:
    rec = Recording()
    svc = WorkflowService(ctx.engine, ctx.clock, rec)  # type: ignore[arg-type]
    rec.svc = svc
    tenant = tenant_with_key(ctx, "acme").tenant_id
    project, _ = svc.create(tenant, "photo_story", user_ref="u", input={"photo_asset_id": "p", "script": "a"})
    assert rec.published == []  # nobody can be following a project before its id was answered
    (step,) = svc.claim(["photo_check"])
    svc.report_success(step.id, output_json={"ok": True})
    assert rec.published == [project.id] * 2 and rec.seen_seq == [2, 3]  # each commit visible when signalled
    with pytest.raises(IllegalState):
        svc.retry_step(project.id, "photo_check")  # refused: rolled back, nobody woken
    assert svc.claim(["video"]) == []  # nothing moved: no signal either
    assert len(rec.published) == 2


def test_a_signal_crosses_redis_to_another_process_stream(ctx: AppContext) -> None:
    prefix = next(private_prefix("projsig"))
    api = RedisNotifier(redis.Redis.from_url(REDIS_URL), key_prefix=prefix)
    worker = RedisNotifier(redis.Redis.from_url(REDIS_URL), key_prefix=prefix)
    svc = WorkflowService(ctx.engine, ctx.clock, worker)
    tenant = tenant_with_key(ctx, "acme").tenant_id
    project, _ = svc.create(tenant, "photo_story", user_ref="u", input={"photo_asset_id": "p", "script": "a"})

    async def main() -> tuple[bool, bool]:
        with api.subscribe(project.id) as sub:
            assert await asyncio.to_thread(api.listening.wait, 5.0)
            quiet = await sub.wait(0.2)  # nothing happened yet
            await asyncio.to_thread(svc.claim, ["photo_check"])
            return quiet, await sub.wait(5.0)

    try:
        quiet, woken = asyncio.run(main())
    finally:
        api.close()
        worker.close()
    assert (quiet, woken) == (False, True)
