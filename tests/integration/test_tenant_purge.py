"""`aivedio tenants purge` (issue 16 item 4) on both databases and both stores, against data made
by real work: generations run through the sim provider, output fetch and media; an uploaded input; a rejected
upload still in quarantine; System B projects (rows and a step file). Afterwards no object of the tenant is left
in the store, no row anywhere holds its prompt text, the ledger adds up to exactly what it did, and another tenant
is untouched."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.clock import new_id
from aivedio_engine.db.tables import (
    audit_log,
    credit_ledger,
    generation_tasks,
    metadata,
    projects,
    tenants,
    workflow_tasks,
)
from aivedio_engine.services.errors import IllegalState
from aivedio_engine.services.invariants import InvariantService
from aivedio_engine.services.operations import Operation
from aivedio_engine.storage import keys
from tests.integration.test_storage_scan import clip, fresh_bucket  # noqa: F401 - fixture
from tests.support.app import tenant_with_key
from tests.support.balance import balance_of
from tests.support.flow import Driver, sim_context
from tests.support.pump import Pump
from tests.support.sim import SimHandle

runner = CliRunner()
#: words only the purged tenant's prompts contain, and only the other tenant's
SECRET, OTHERS = "zanzibar-heron-secret", "kilimanjaro-otter"


@pytest.fixture(params=["sqlite-fs", "postgres-fs", "sqlite-s3", "postgres-s3"])
def world(request: pytest.FixtureRequest, tmp_path: Path, sim: SimHandle) -> Iterator[tuple[AppContext, list[str]]]:
    db, store = request.param.split("-")
    url = request.getfixturevalue("pg_url") if db == "postgres" else None
    overrides: dict[str, Any] = {"sweeper": {"rejected_upload_grace_s": 86_400}}
    sets = [f"data_dir={tmp_path / 'data'}"] + ([f"database.url={url}"] if url else [])
    if store == "s3":
        overrides["storage"] = fresh_bucket(request.getfixturevalue("moto_s3"))
        sets += [f"storage.{k}={v}" for k, v in overrides["storage"].items()]
    ctx = sim_context(tmp_path, sim, url, **overrides)
    yield ctx, sets
    ctx.close()


def cli(sets: list[str], *args: str) -> Any:
    return runner.invoke(app, [a for s in sets for a in ("--set", s)] + list(args), env={"AIVEDIO_TRACEBACK": "1"})


def generate(ctx: AppContext, tenant_id: uuid.UUID, name: str, prompt: str, assets: list[str] = ()) -> uuid.UUID:  # type: ignore[assignment]
    params: dict[str, Any] = {"prompt": prompt, "model": "sim-v1", "duration_s": 2}
    if assets:
        params["asset_ids"] = list(assets)
    return ctx.generations.create(tenant_id, name, params).task.id


def upload(ctx: AppContext, key: str, data: bytes, declared: int) -> str:
    who = ctx.tenants.authenticate(key)
    assert who is not None
    view, _ = ctx.assets.create_upload(who, "in.mp4", declared, "video/mp4")
    ctx.assets.write_upload(who, view.id, [data])
    return str(ctx.assets.complete(who, view.id).id)


def objects(ctx: AppContext, tenant_id: uuid.UUID) -> list[str]:
    return [o.key for o in ctx.storage.iter_objects(keys.tenant_prefix(tenant_id))]


def ledger(ctx: AppContext, tenant_id: uuid.UUID) -> tuple[int, Decimal, Decimal]:
    c = credit_ledger.c
    with ctx.engine.connect() as conn:
        count, total = conn.execute(
            sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(c.amount), 0)).where(c.tenant_id == tenant_id)
        ).one()
        balance = balance_of(conn, tenant_id)
    return int(count), Decimal(total), Decimal(balance)


def rows_mentioning(ctx: AppContext, word: str) -> dict[str, int]:
    """Every table, every row, every column as text: where the word still appears."""
    found: dict[str, int] = {}
    with ctx.engine.connect() as conn:
        for table in metadata.sorted_tables:
            hits = sum(word in repr(tuple(row)) for row in conn.execute(sa.select(table)))
            if hits:
                found[table.name] = hits
    return found


def project(ctx: AppContext, tenant_id: uuid.UUID, status: str) -> str:
    """A System B project with one step, its words in the input and the step's documents, and one step file
    (under workflows/{project}/, outside the tenant's prefix)."""
    now, pid = ctx.clock.now(), new_id()
    with ctx.engine.begin() as conn:
        conn.execute(
            projects.insert().values(
                id=pid,
                tenant_id=tenant_id,
                workflow="photo_story",
                user_ref="u",
                input={"script": f"{SECRET} script"},
                input_hash="0" * 64,
                status=status,
                created_at=now,
                updated_at=now,
            )
        )
        conn.execute(
            workflow_tasks.insert().values(
                id=new_id(),
                project_id=pid,
                step_key="plan",
                task_type="plan",
                queue="text",
                priority=3,
                status="success" if status == "succeeded" else "pending",
                input_json={"script": f"{SECRET} script"},
                input_hash="0" * 64,
                output_json={"plan": f"{SECRET} plan"},
                created_at=now,
                updated_at=now,
            )
        )
    key = f"workflows/{pid}/plan/plan.json"
    ctx.storage.put_stream(key, [SECRET.encode()], "application/json", max_bytes=100)
    return key


def test_a_purge_leaves_no_object_and_no_prompt_and_the_ledger_unchanged(
    world: tuple[AppContext, list[str]], sim: SimHandle, clip: bytes
) -> None:
    ctx, sets = world
    acme, other = tenant_with_key(ctx, "acme", credits=1000), tenant_with_key(ctx, "other", credits=1000)
    reference = upload(ctx, acme.key, clip, len(clip))
    upload(ctx, acme.key, clip[:500], len(clip))  # rejected: stays in quarantine for its grace
    for i in range(2):
        generate(ctx, acme.tenant_id, f"a{i}", f"{SECRET} number {i}", [reference] if i == 0 else [])
    generate(ctx, other.tenant_id, "o0", f"{OTHERS} scene")
    driver = Driver(ctx, sim, Pump(ctx))
    driver.run_until(lambda: driver.all_in("SUCCEEDED"), max_rounds=60)

    mine, theirs = objects(ctx, acme.tenant_id), objects(ctx, other.tenant_id)
    assert any(keys.is_quarantined(k) for k in mine) and any("/tasks/" in k for k in mine)
    assert rows_mentioning(ctx, SECRET) and rows_mentioning(ctx, OTHERS)
    books = {t: ledger(ctx, t) for t in (acme.tenant_id, other.tenant_id)}

    step_file = project(ctx, acme.tenant_id, "succeeded")

    # an unfinished task or project: refused, nothing changed
    late = generate(ctx, acme.tenant_id, "late", f"{SECRET} late")
    running = project(ctx, acme.tenant_id, "running")
    with pytest.raises(IllegalState, match="1 unfinished task.* and 1 unfinished project"):
        ctx.tenant_purger.purge(acme.tenant_id, Operation("tenants purge", "gdpr", dry_run=False))
    with ctx.engine.begin() as conn:
        conn.execute(projects.update().where(projects.c.status == "running").values(status="cancelled"))
    driver.run_until(lambda: driver.all_in("SUCCEEDED"), max_rounds=60)
    mine = objects(ctx, acme.tenant_id)
    books[acme.tenant_id] = ledger(ctx, acme.tenant_id)

    dry = cli(sets, "tenants", "purge", str(acme.tenant_id), "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    preview = json.loads(dry.stdout)
    assert (preview["dry_run"], preview["objects"], preview["prompts"]) == (True, len(mine) + 2, 3)
    assert objects(ctx, acme.tenant_id) == mine  # a dry run deletes nothing

    refused = cli(sets, "tenants", "purge", str(acme.tenant_id), "--yes")
    assert refused.exit_code == 2 and "--reason is required" in refused.output
    done = cli(sets, "tenants", "purge", str(acme.tenant_id), "--reason", "erasure request #42", "--yes", "--json")
    assert done.exit_code == 0, done.output
    result = json.loads(done.stdout)
    assert (result["objects_deleted"], result["objects_failed"], result["objects_left"]) == (len(mine) + 2, 0, 0)
    assert (result["prompts"], result["projects"], result["keys_revoked"]) == (3, 2, 1)

    assert objects(ctx, acme.tenant_id) == []
    assert ctx.storage.head(step_file) is None and ctx.storage.head(running) is None
    assert objects(ctx, other.tenant_id) == theirs
    assert rows_mentioning(ctx, SECRET) == {}
    assert rows_mentioning(ctx, OTHERS)  # the other tenant keeps its prompt
    assert {t: ledger(ctx, t) for t in books} == books  # amounts and ids stay, and still add up
    with ctx.engine.connect() as conn:
        task = conn.execute(sa.select(generation_tasks).where(generation_tasks.c.id == late)).one()
        tenant = conn.execute(sa.select(tenants).where(tenants.c.id == acme.tenant_id)).one()
        audits = conn.execute(sa.select(audit_log).where(audit_log.c.command == "tenants purge")).all()
    assert (task.status, task.prompt, task.params["prompt"]) == ("SUCCEEDED", "[redacted]", "[redacted]")
    assert tenant.status == "SUSPENDED" and tenant.purged_at is not None
    assert ctx.tenants.authenticate(acme.key) is None
    assert [(a.dry_run, a.outcome, a.reason) for a in audits] == [
        (True, "dry_run", None),
        (False, "purged", "erasure request #42"),
    ]
    assert audits[1].args["counts"]["objects_deleted"] == len(mine) + 2

    audit = InvariantService(ctx.engine, ctx.clock).run()  # deleted on purpose is not a broken SUCCEEDED task
    assert [(c.id, c.rows) for c in audit.results if not c.ok] == []

    again = cli(sets, "tenants", "purge", str(acme.tenant_id), "--reason", "again", "--yes", "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["objects_deleted"] == 0  # idempotent
