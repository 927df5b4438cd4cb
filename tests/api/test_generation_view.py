"""What a client is shown of a generation is the same whichever way it asks: the create's replay (same
Idempotency-Key, same request), GET on the id, the list and the lookup by key all carry the finished task's
outputs — signed URLs that play, their asset rows, every variant of a request for `n` — and the list reads the
outputs of a whole page in one statement."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.client import EmbeddedClient
from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import generation_tasks
from aivedio_engine.services.tenants import Principal
from aivedio_engine.worker.runtime import Runtime
from tests.support.app import TenantKey, make_context, running_api, tenant_with_key
from tests.support.sim import wait_until

#: the requests made, by Idempotency-Key
BODIES = {
    "one": {"prompt": "waves", "model": "local-v1", "duration_s": 2},
    "two": {"prompt": "dunes", "model": "local-v1", "duration_s": 2, "n": 2},
    "three": {"prompt": "fog", "model": "local-v1", "duration_s": 2},
}
#: a statement reading the assets table (any alias of it)
_READS_ASSETS = re.compile(r"\b(FROM|JOIN)\s+assets\b", re.IGNORECASE)


@dataclass
class Finished:
    ctx: AppContext
    base: str
    who: TenantKey
    #: task id by Idempotency-Key, every one SUCCEEDED
    ids: dict[str, str]

    def create(self, key: str) -> httpx.Response:
        return httpx.post(
            f"{self.base}/v1/generations", headers={**self.who.headers, "Idempotency-Key": key}, json=BODIES[key]
        )

    def get(self, key: str) -> dict[str, Any]:
        r = httpx.get(f"{self.base}/v1/generations/{self.ids[key]}", headers=self.who.headers)
        assert r.status_code == 200, r.text
        return dict(r.json())


@pytest.fixture(params=["embedded", "postgres"])
def finished(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Finished]:
    """Three SUCCEEDED generations (one of two outputs) behind the real API; the engine's roles are stopped once
    they finished, so the only statements left are the API's."""
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    ctx = make_context(tmp_path / "data", url, polling={"min_interval_s": 1, "max_interval_s": 2, "jitter": 0})
    who = tenant_with_key(ctx, "alice", credits=100)
    runtime = Runtime(ctx, {"relay", "worker", "scheduler", "sweeper"}, threading.Event())
    runtime.start()
    try:
        with running_api(ctx) as base:
            done = Finished(ctx, base, who, {})
            for key in BODIES:
                r = done.create(key)
                assert r.status_code == 202, r.text
                done.ids[key] = r.json()["id"]

            def all_succeeded() -> bool:
                with ctx.engine.connect() as conn:
                    states = conn.execute(sa.select(generation_tasks.c.status)).scalars().all()
                assert not set(states) & {"FAILED_FINAL", "EXPIRED", "CANCELED", "MANUAL_REVIEW"}, states
                return len(states) == len(BODIES) and set(states) == {"SUCCEEDED"}

            wait_until(all_succeeded, timeout_s=180, what="every generation SUCCEEDED")
            runtime.shutdown()
            assert runtime.failed is None
            yield done
    finally:
        runtime.shutdown()
        ctx.close()


def _where(url: str) -> str:
    """A signed URL without its signature: the signature and expiry are minted per answer."""
    return urlsplit(url).path


def _shown(doc: dict[str, Any]) -> dict[str, Any]:
    """What a document shows of a task's outputs, signatures left out."""
    return {
        "outputs": {p: _where(u) for p, u in doc["outputs"].items()},
        "output_assets": doc["output_assets"],
        "variants": [
            {
                "index": v["index"],
                "outputs": {p: _where(u) for p, u in v["outputs"].items()},
                "output_assets": v["output_assets"],
            }
            for v in doc["variants"]
        ],
    }


def _plays(doc: dict[str, Any]) -> None:
    """Every proxy_mp4 the document names downloads, and its bytes are what its asset row says."""
    for v in doc["variants"]:
        proxy = httpx.get(v["outputs"]["proxy_mp4"])
        assert proxy.status_code == 200 and proxy.content[4:8] == b"ftyp"
        assert hashlib.sha256(proxy.content).hexdigest() == v["output_assets"]["proxy_mp4"]["sha256"]
    assert httpx.get(doc["outputs"]["hls"]).status_code == 200


def test_a_replay_of_a_succeeded_task_answers_what_get_answers(finished: Finished) -> None:
    got = finished.get("one")
    assert {"proxy_mp4", "hls", "thumbnail"} <= got["outputs"].keys()
    replay = finished.create("one")
    assert replay.status_code == 202, replay.text
    assert replay.headers["idempotent-replayed"] == "true"
    doc = replay.json()
    assert doc["id"] == got["id"] and doc["status"] == "SUCCEEDED"
    assert _shown(doc) == _shown(got)
    assert all(u.startswith(finished.base) for u in doc["outputs"].values())  # absolute, as GET's
    _plays(doc)


def test_a_replay_of_a_multi_output_task_has_every_variant(finished: Finished) -> None:
    got = finished.get("two")
    doc = finished.create("two").json()
    assert [v["index"] for v in doc["variants"]] == [0, 1]
    assert _shown(doc) == _shown(got)
    assert doc["variants"][0]["output_assets"] == doc["output_assets"]  # `outputs` stays the first one's
    ids = {v["output_assets"]["proxy_mp4"]["id"] for v in doc["variants"]}
    assert len(ids) == 2
    _plays(doc)


def test_the_list_and_the_lookup_by_key_carry_the_outputs(finished: Finished) -> None:
    r = httpx.get(f"{finished.base}/v1/generations", headers=finished.who.headers)
    assert r.status_code == 200, r.text
    listed = {d["id"]: d for d in r.json()["data"]}
    assert listed.keys() == set(finished.ids.values())
    for key, tid in finished.ids.items():
        assert _shown(listed[tid]) == _shown(finished.get(key)), key
    _plays(listed[finished.ids["two"]])
    found = httpx.get(
        f"{finished.base}/v1/generations", params={"idempotency_key": "two"}, headers=finished.who.headers
    ).json()["data"]
    assert [_shown(d) for d in found] == [_shown(finished.get("two"))]


def test_the_list_reads_a_pages_outputs_in_one_statement(finished: Finished) -> None:
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(statement)

    sa.event.listen(finished.ctx.engine, "before_cursor_execute", record)
    try:
        page = httpx.get(f"{finished.base}/v1/generations", headers=finished.who.headers).json()["data"]
    finally:
        sa.event.remove(finished.ctx.engine, "before_cursor_execute", record)
    assert len(page) == len(BODIES) and all(d["outputs"] for d in page)
    assert len([s for s in seen if _READS_ASSETS.search(s)]) == 1, seen


def test_the_embedded_clients_list_carries_local_outputs(finished: Finished) -> None:
    """`aivedio generations list --json` without --api-url: the same outputs, as files on this machine."""
    client = EmbeddedClient(finished.ctx, Principal(finished.who.tenant_id, new_id()))
    listed = {s.id: s for s in client.list_generations(None, 10)}
    for tid in finished.ids.values():
        one = client.get(tid)
        assert listed[tid].outputs == one.outputs and listed[tid].variants == one.variants
        assert {"proxy_mp4", "hls", "thumbnail"} <= one.outputs.keys()
        assert all(Path(p).is_file() for p in one.outputs.values())
    assert [v["index"] for v in listed[finished.ids["two"]].variants] == [0, 1]
