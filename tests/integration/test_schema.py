"""The migrated PostgreSQL schema equals the SQLAlchemy mirror, and its constraints do their job.

Two views of drift: the inspector (names, types, nullability, keys, indexes) for readable failures, and a
catalog comparison against the mirror created by `create_all` in a second schema, where PostgreSQL itself
normalises CHECK texts, defaults and partial-index predicates so they can be compared exactly.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from aivedio_engine.config import load_settings
from aivedio_engine.db import migrate, tables
from aivedio_engine.db.engine import make_engine
from aivedio_engine.domain.status import CHECKED_COLUMNS, AttemptStatus, LedgerEntryType, TaskStatus

pytestmark = pytest.mark.postgres

PG = postgresql.dialect()
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def engine(pg_url: str) -> Iterator[sa.Engine]:
    eng = make_engine(load_settings(overrides={"database": {"url": pg_url}}))
    migrate.upgrade(eng)
    yield eng
    eng.dispose()


def _pg_type(t: Any) -> str:
    return str(t.compile(dialect=PG))


def _mirror_indexes(table: sa.Table) -> dict[str, tuple[tuple[str, ...], bool, bool]]:
    return {
        ix.name: (
            tuple(c.name for c in ix.columns),
            bool(ix.unique),
            ix.dialect_options["postgresql"]["where"] is not None,
        )
        for ix in table.indexes
    }


def test_same_tables(engine: sa.Engine) -> None:
    assert set(sa.inspect(engine).get_table_names()) == set(tables.metadata.tables)


def test_columns_match_mirror(engine: sa.Engine) -> None:
    insp = sa.inspect(engine)
    for table in tables.metadata.sorted_tables:
        reflected = insp.get_columns(table.name)
        assert [c["name"] for c in reflected] == [c.name for c in table.columns], table.name
        for col, ref in zip(table.columns, reflected, strict=True):
            where = f"{table.name}.{col.name}"
            assert _pg_type(ref["type"]) == _pg_type(col.type), where
            assert ref["nullable"] == col.nullable, where
            assert (ref["default"] is not None) == (col.server_default is not None), where


def test_keys_and_constraints_match_mirror(engine: sa.Engine) -> None:
    insp = sa.inspect(engine)
    for table in tables.metadata.sorted_tables:
        pk = insp.get_pk_constraint(table.name)
        assert (pk["name"], pk["constrained_columns"]) == (table.primary_key.name, [c.name for c in table.primary_key])

        uniques = {u["name"]: set(u["column_names"]) for u in insp.get_unique_constraints(table.name)}
        mirror_uniques = {
            c.name: {col.name for col in c.columns} for c in table.constraints if isinstance(c, sa.UniqueConstraint)
        }
        assert uniques == mirror_uniques, table.name

        fks = {
            f["name"]: (f["constrained_columns"], f["referred_table"], f["referred_columns"])
            for f in insp.get_foreign_keys(table.name)
        }
        mirror_fks = {
            fk.name: ([c.name for c in fk.columns], fk.referred_table.name, [e.column.name for e in fk.elements])
            for fk in table.foreign_key_constraints
        }
        assert fks == mirror_fks, table.name

        checks = {c["name"] for c in insp.get_check_constraints(table.name)}
        assert checks == {c.name for c in table.constraints if isinstance(c, sa.CheckConstraint)}, table.name


def test_indexes_match_mirror(engine: sa.Engine) -> None:
    insp = sa.inspect(engine)
    for table in tables.metadata.sorted_tables:
        reflected = {
            ix["name"]: (
                tuple(ix["column_names"]),
                bool(ix["unique"]),
                bool(ix.get("dialect_options", {}).get("postgresql_where")),
            )
            for ix in insp.get_indexes(table.name)
            if "duplicates_constraint" not in ix  # the index behind a UNIQUE / PRIMARY KEY constraint
        }
        assert reflected == _mirror_indexes(table), table.name


def _catalog(conn: sa.Connection, schema: str) -> dict[str, Any]:
    """Columns, constraints and indexes of every table in `schema`, as PostgreSQL prints them."""

    def strip(text: str) -> str:
        return text.replace(f"{schema}.", "")

    columns = conn.execute(
        sa.text("""
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, pg_get_expr(d.adbin, d.adrelid)
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = :s AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY c.relname, a.attnum"""),
        {"s": schema},
    ).all()
    constraints = conn.execute(
        sa.text("""
        SELECT c.relname, con.conname, pg_get_constraintdef(con.oid)
        FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = :s ORDER BY 1, 2"""),
        {"s": schema},
    ).all()
    indexes = conn.execute(
        sa.text("""
        SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = :s ORDER BY 1, 2"""),
        {"s": schema},
    ).all()
    return {
        "columns": [tuple(r) for r in columns],
        "constraints": [(t, n, strip(d)) for t, n, d in constraints],
        "indexes": [(t, n, strip(d)) for t, n, d in indexes],
    }


def test_catalog_definitions_match_mirror_created_by_sqlalchemy(engine: sa.Engine) -> None:
    """CHECK texts, defaults, DESC columns and partial-index predicates, normalised by PostgreSQL itself."""
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE SCHEMA mirror")
        # on a copy: create_all breaks the generation_tasks <-> assets foreign-key cycle by marking one key
        # use_alter on the metadata it is given, which would change the SQLite DDL (and the embedded schema
        # marker) for every later test in this process
        copy = sa.MetaData(naming_convention=tables.metadata.naming_convention)
        for table in tables.metadata.sorted_tables:
            table.to_metadata(copy)
        copy.create_all(conn.execution_options(schema_translate_map={None: "mirror"}))
    with engine.connect() as conn:
        migrated, mirror = _catalog(conn, "public"), _catalog(conn, "mirror")
    for part in ("columns", "constraints", "indexes"):
        assert migrated[part], part
        assert sorted(set(migrated[part]) - set(mirror[part])) == [], f"{part} only in sql/migrations"
        assert sorted(set(mirror[part]) - set(migrated[part])) == [], f"{part} only in tables.py"


def _check_values(conn: sa.Connection, table: str, column: str) -> set[str]:
    defs = (
        conn.execute(
            sa.text("""
        SELECT pg_get_constraintdef(con.oid)
        FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY (con.conkey)
        WHERE con.contype = 'c' AND c.relname = :t AND a.attname = :c AND cardinality(con.conkey) = 1"""),
            {"t": table, "c": column},
        )
        .scalars()
        .all()
    )
    lists = [d for d in defs if "= ANY" in d]
    assert len(lists) == 1, f"{table}.{column}: expected one CHECK (... IN (...)), found {defs}"
    return {v.replace("''", "'") for v in re.findall(r"'((?:[^']|'')*)'::", lists[0])}


def test_status_enums_match_sql_checks(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        for key, enum in CHECKED_COLUMNS.items():
            table, column = key.split(".")
            assert _check_values(conn, table, column) == {m.value for m in enum}, key
        # checks built from enum subsets (and columns not listed in CHECKED_COLUMNS) must match as well
        for key, values in tables.enum_checks().items():
            assert _check_values(conn, *key.split(".")) == set(values), key
    for key, enum in CHECKED_COLUMNS.items():
        assert tables.enum_checks()[key] == tuple(m.value for m in enum), key


def test_fencing_token_sequence_only_grows(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        first, second = (conn.execute(sa.text("SELECT nextval('fencing_token_seq')")).scalar_one() for _ in range(2))
        conn.rollback()  # sequences ignore rollback: a token is never handed out twice
        third = conn.execute(sa.text("SELECT nextval('fencing_token_seq')")).scalar_one()
    assert first < second < third


# --- constraint behaviour -----------------------------------------------------------------------------------


def _tenant(conn: sa.Connection) -> uuid.UUID:
    tid = uuid.uuid4()
    conn.execute(tables.tenants.insert().values(id=tid, name=f"t-{tid}", created_at=NOW, updated_at=NOW))
    return tid


def _task(conn: sa.Connection, tenant_id: uuid.UUID) -> uuid.UUID:
    task_id = uuid.uuid4()
    conn.execute(
        tables.generation_tasks.insert().values(
            id=task_id,
            tenant_id=tenant_id,
            client_idempotency_key=str(task_id),
            request_hash=b"h",
            status=TaskStatus.QUEUED.value,
            requested_model="local-v1",
            estimated_cost=Decimal("5"),
            prompt="a cat",
            params={"seconds": 5},
            created_at=NOW,
            updated_at=NOW,
        )
    )
    return task_id


def _attempt(
    conn: sa.Connection,
    task_id: uuid.UUID,
    no: int,
    state: AttemptStatus,
    job: str | None = None,
    provider: str = "sim",
) -> uuid.UUID:
    aid = uuid.uuid4()
    conn.execute(
        tables.task_attempts.insert().values(
            id=aid,
            task_id=task_id,
            attempt_no=no,
            provider=provider,
            model="m",
            provider_request_key=f"req-{aid}",
            provider_job_id=job,
            submit_state=state.value,
            request_fingerprint=b"f",
            created_at=NOW,
            updated_at=NOW,
        )
    )
    return aid


def _violation(exc: pytest.ExceptionInfo[sa.exc.DBAPIError]) -> tuple[type, str | None]:
    return type(exc.value.orig), exc.value.orig.diag.constraint_name  # type: ignore[union-attr]


def test_ledger_is_append_only(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        tid = _tenant(conn)
        conn.execute(
            tables.credit_ledger.insert().values(
                id=uuid.uuid4(),
                tenant_id=tid,
                entry_type=LedgerEntryType.ADJUSTMENT.value,
                amount=Decimal("10"),
                business_key="adjustment:x:1",
                created_by="test",
                created_at=NOW,
            )
        )
    for statement in ("UPDATE credit_ledger SET amount = 0", "DELETE FROM credit_ledger", "TRUNCATE credit_ledger"):
        with pytest.raises(sa.exc.DBAPIError, match="append-only") as exc, engine.begin() as conn:
            conn.exec_driver_sql(statement)
        assert isinstance(exc.value.orig, psycopg.errors.RestrictViolation), statement
    with engine.connect() as conn:
        assert conn.execute(sa.select(tables.credit_ledger.c.amount)).scalar_one() == Decimal("10")


def test_ledger_sign_convention_is_enforced(engine: sa.Engine) -> None:
    with pytest.raises(sa.exc.IntegrityError) as exc, engine.begin() as conn:
        conn.execute(
            tables.credit_ledger.insert().values(
                id=uuid.uuid4(),
                tenant_id=_tenant(conn),
                entry_type=LedgerEntryType.RESERVE.value,
                amount=Decimal("5"),
                business_key="reserve:x",
                created_by="test",
                created_at=NOW,
            )
        )
    assert _violation(exc) == (psycopg.errors.CheckViolation, "ck_credit_ledger_amount_sign")


def test_at_most_one_in_flight_attempt_per_task(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        task_id = _task(conn, _tenant(conn))
        first = _attempt(conn, task_id, 1, AttemptStatus.SENDING)
    with pytest.raises(sa.exc.IntegrityError) as exc, engine.begin() as conn:
        _attempt(conn, task_id, 2, AttemptStatus.NEW)
    assert _violation(exc) == (psycopg.errors.UniqueViolation, "uq_task_attempts_one_in_flight")
    with engine.begin() as conn:  # once the first attempt is settled, a new one may start
        conn.execute(
            tables.task_attempts.update()
            .where(tables.task_attempts.c.id == first)
            .values(submit_state=AttemptStatus.FAILED_BEFORE_ACCEPT.value)
        )
        _attempt(conn, task_id, 2, AttemptStatus.NEW)


def test_provider_job_id_unique_per_provider_but_nulls_allowed(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        tenant = _tenant(conn)
        for _ in range(3):  # many attempts without a job id yet
            _attempt(conn, _task(conn, tenant), 1, AttemptStatus.SENDING)
        _attempt(conn, _task(conn, tenant), 1, AttemptStatus.RUNNING, job="job-1")
        _attempt(conn, _task(conn, tenant), 1, AttemptStatus.RUNNING, job="job-1", provider="other")
    with pytest.raises(sa.exc.IntegrityError) as exc, engine.begin() as conn:
        _attempt(conn, _task(conn, tenant), 1, AttemptStatus.RUNNING, job="job-1")
    assert _violation(exc) == (psycopg.errors.UniqueViolation, "uq_task_attempts_provider_job")


def test_enum_check_rejects_unknown_status(engine: sa.Engine) -> None:
    with pytest.raises(sa.exc.IntegrityError) as exc, engine.begin() as conn:
        task_id = _task(conn, _tenant(conn))
        conn.execute(
            tables.generation_tasks.update().where(tables.generation_tasks.c.id == task_id).values(status="DONE")
        )
    assert _violation(exc) == (psycopg.errors.CheckViolation, "ck_generation_tasks_status")
