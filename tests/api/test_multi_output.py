"""`n` on POST /v1/generations (issue 10 item 8): part of the request and its hash, held to the model's
`max_outputs` before anything is reserved, and priced per output."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import credit_ledger, generation_tasks
from aivedio_engine.domain.requests import GenerationParams, request_hash
from tests.support.app import TenantKey, make_context, tenant_with_key
from tests.support.balance import balance_of

BODY = {"prompt": "a red fox running through snow", "model": "local-v1", "duration_s": 2}
LOCAL_MODEL = {"max_duration_s": 10, "resolutions": ["360p", "720p"], "price_per_second": {"360p": "0.5", "720p": "1"}}
#: a vendor model configured for 4 outputs: its adapter makes one, so the catalog allows one
KLING = {
    "adapter": "kling",
    "base_url": "https://kling.test",
    "models": {
        "kling-v2-master": {
            "max_duration_s": 10,
            "resolutions": ["720p"],
            "price_per_second": {"720p": "1"},
            "max_outputs": 4,
        }
    },
}


@pytest.fixture(params=["embedded", "postgres"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    context = make_context(
        tmp_path / "data",
        url,
        providers={
            "local": {
                "adapter": "local",
                "allow_http_origin": True,
                "output_hosts": ["127.0.0.1"],
                "models": {"local-v1": {**LOCAL_MODEL, "max_outputs": 3}},
            },
            "kling": KLING,
        },
    )
    yield context
    context.close()


@pytest.fixture
def client(ctx: AppContext) -> TestClient:
    return TestClient(create_app(ctx))


@pytest.fixture
def alice(ctx: AppContext) -> TenantKey:
    return tenant_with_key(ctx, "alice", credits=100)


def post(client: TestClient, who: TenantKey, key: str, body: dict) -> object:
    return client.post("/v1/generations", json=body, headers={**who.headers, "Idempotency-Key": key})


def count(ctx: AppContext, table: sa.Table, *where: object) -> int:
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one()


def balance(ctx: AppContext, tenant_id: object) -> Decimal:
    with ctx.engine.connect() as conn:
        return balance_of(conn, tenant_id)


def test_n_is_priced_per_output_and_kept_in_the_params(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    r = post(client, alice, "three", {**BODY, "n": 3})
    assert r.status_code == 202, r.text
    task = r.json()
    assert task["estimated_cost"] == "3.00000000"  # 0.5 credits/s x 2 s x 3 outputs
    assert task["params"]["n"] == 3
    assert balance(ctx, alice.tenant_id) == Decimal(97)
    tid = uuid.UUID(task["id"])
    with ctx.engine.connect() as conn:
        reserved = conn.execute(
            sa.select(credit_ledger.c.amount).where(
                credit_ledger.c.task_id == tid, credit_ledger.c.entry_type == "RESERVE"
            )
        ).scalar_one()
    assert Decimal(reserved) == Decimal(-3)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({**BODY, "n": 4}, "at most 3 output(s)"),  # over this model's max_outputs
        ({**BODY, "n": 5}, "between 1 and 4"),  # over what any request may ask
        ({**BODY, "n": 0}, "between 1 and 4"),
        ({**BODY, "n": "2"}, "n"),  # strict: a string is not a count
        ({**BODY, "n": 2.0}, "n"),
        ({**BODY, "model": "kling-v2-master", "duration_s": 5, "n": 2}, "at most 1 output(s)"),  # adapter makes one
    ],
)
def test_too_many_outputs_is_422_naming_the_limit_and_reserves_nothing(
    ctx: AppContext, client: TestClient, alice: TenantKey, body: dict, says: str
) -> None:
    r = post(client, alice, "k", body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert says in r.text
    assert count(ctx, generation_tasks) == 0
    assert count(ctx, credit_ledger, credit_ledger.c.entry_type == "RESERVE") == 0
    assert balance(ctx, alice.tenant_id) == Decimal(100)


def test_n_is_part_of_the_request_hash(ctx: AppContext, client: TestClient, alice: TenantKey) -> None:
    one = post(client, alice, "same", BODY).json()
    spelled = post(client, alice, "same", {**BODY, "n": 1})  # n=1 is the default: the same request
    assert spelled.status_code == 202 and spelled.json()["id"] == one["id"]
    two = post(client, alice, "same", {**BODY, "n": 2})  # another request under the same key
    assert two.status_code == 409, two.text
    assert count(ctx, generation_tasks) == 1


def test_a_single_output_request_keeps_its_hash() -> None:
    params = GenerationParams("p", "local-v1", "local", 2, "16:9", "360p", 0, 3600)
    assert "n" not in params.canonical()
    assert request_hash(params) != request_hash(
        GenerationParams("p", "local-v1", "local", 2, "16:9", "360p", 0, 3600, n=2)
    )


def test_models_list_shows_max_outputs(client: TestClient, alice: TenantKey) -> None:
    models = {m["model"]: m for m in client.get("/v1/models", headers=alice.headers).json()["data"]}
    assert models["local-v1"]["max_outputs"] == 3
    assert models["kling-v2-master"]["max_outputs"] == 1
