"""bench/own_sql.py's pure parts: a captured statement list rendered as a pgbench script, how each parameter is
classified (constant, entity of :idx, generated id, timestamp, hash, digest), pgbench-safe literals, and the
round-trip counter's reading of libpq traces. Nothing here needs a database: values are rendered with psycopg's
own `sql.Literal` without a connection."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from bench.common import BenchError, script_round_trips
from bench.own_sql import (
    FLIGHT_SEP,
    PIPELINE_SYNC,
    Operation,
    Stmt,
    Tx,
    _Renderer,
    _Side,
    choice_entity,
    committed_segments,
    int_entity,
    parse_trace,
    pgbench_safe,
    ready_for_query,
    render_script,
    sql_label,
    text_entity,
    trace_waits,
)


def literal(value: Any) -> str:
    return sql.Literal(value).as_string(None).strip()


T0 = datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=UTC)
TENANTS = [uuid.UUID(int=0xA1), uuid.UUID(int=0xA2)]
KEY = text_entity("idempotency key", "own-key-", "-end")
ENTITIES = [choice_entity("tenant", TENANTS, 2, 2), KEY]
ALLOWED = {"idx", "tsn", "n", "base", "stride", "ts", "client_id"}


def op(index: int, *txs: Tx) -> Operation:
    return Operation(index, "create", list(txs))


def tx(*stmts: Stmt, began: datetime = T0) -> Tx:
    return Tx(began, list(stmts), end="commit")


def body(script_text: str) -> list[str]:
    """The script without its header (comments and \\set lines)."""
    return [ln for ln in script_text.splitlines() if not ln.startswith(("--", "\\set"))]


# ------------------------------------------------------------------------------------------- the create CTE
CTE = """
WITH task AS (
    INSERT INTO tasks (id, tenant_id, key, hash, cost, params, deadline_at, created_at)
    VALUES (%(id)s, %(tenant_id)s, %(key)s, %(hash)s, %(cost)s, %(params)s, %(deadline)s, %(now)s)
    ON CONFLICT (tenant_id, key) DO NOTHING
    RETURNING *
), balance AS (
    UPDATE tenants SET balance = balance - %(cost)s WHERE id = %(tenant_id)s AND EXISTS (SELECT FROM task)
    RETURNING balance
), events AS (
    INSERT INTO events (id, task_id, source_event_id, event_type, from_status, version)
    SELECT e.id, task.id, task.id::text || ':' || e.version, e.event_type, e.from_status, e.version
    FROM task, unnest(%(ev_ids)s::uuid[], %(ev_types)s::text[], %(ev_from)s::text[], %(ev_versions)s::bigint[])
        AS e(id, event_type, from_status, version)
), queued AS (
    INSERT INTO outbox (id, task_id, business_key, payload)
    SELECT %(outbox_id)s, task.id, 'reserve:' || task.id::text, %(payload)s FROM task
)
SELECT task.id, (SELECT count(*) FROM balance) AS reserved FROM task
"""
LOCK = "SELECT set_config('lock_timeout', '1500ms', true)"


def create_params(i: int, began: datetime) -> dict[str, Any]:
    task_id = uuid.uuid4()
    now = began - timedelta(milliseconds=30)
    return {
        "id": task_id,
        "tenant_id": TENANTS[i % 2],
        "key": f"own-key-{i}-end",
        "hash": bytes([i]) * 32,
        "cost": Decimal("1.00000000"),
        "params": Jsonb({"prompt": "a fox:red 'x' \\ snow", "aspect_ratio": "16:9"}),
        "deadline": now + timedelta(hours=1),
        "now": now,
        "ev_ids": [uuid.uuid4() for _ in range(4)],
        "ev_types": ["created", "validation_started", "passed", "queued"],
        "ev_from": [None, "CREATED", "VALIDATING", "RESERVED"],
        "ev_versions": [0, 1, 2, 3],
        "outbox_id": uuid.uuid4(),
        "payload": Jsonb(
            {"task_id": str(task_id), "deadline_at": (now + timedelta(hours=1)).isoformat(), "note": "key:value"}
        ),
    }


def create_op(i: int, batch: int) -> Operation:
    began = T0 + timedelta(seconds=i)
    return op(i, tx(Stmt(LOCK, None, False, batch), Stmt(CTE, create_params(i, began), False, batch), began=began))


@pytest.fixture(scope="module")
def create_script() -> Any:
    return render_script(create_op(2, batch=7), create_op(3, batch=12), literal, ENTITIES, title="t")


def test_a_pipelined_cte_is_one_pipeline_between_begin_and_commit(create_script: Any) -> None:
    lines = body(create_script.text)
    assert lines[0] == "BEGIN;" and lines[1] == "\\startpipeline" and lines[2] == LOCK + ";"
    assert lines[-2:] == ["\\endpipeline", "COMMIT;"]
    assert lines[3].startswith("WITH task AS (") and lines[-3].endswith("FROM task;")
    assert create_script.statements == 2 and create_script.transactions == 1
    assert create_script.round_trips == 3 and create_script.tx_round_trips == [3]  # BEGIN, the pipeline, COMMIT
    assert script_round_trips(create_script.text) == 3  # what the reports count for any script agrees
    assert create_script.shape == [
        [
            "SELECT set_config lock_timeout + WITH (INSERT tasks ON CONFLICT, UPDATE tenants, "
            "INSERT events, INSERT outbox) SELECT task"
        ]
    ]
    assert create_script.warnings == []


def test_every_placeholder_is_replaced_and_the_sql_around_it_kept(create_script: Any) -> None:
    text = create_script.text
    assert "%(" not in text and "%s" not in text
    assert "task.id::text || ':' || e.version" in text  # ':' and '::' outside parameters untouched
    assert "'reserve:' || task.id::text" in text
    assert "balance - 1.00000000" in text  # a constant Decimal as psycopg sends it


def test_cte_parameters_are_classified(create_script: Any) -> None:
    assert create_script.variables == {
        "generated id": 7,  # task id (twice: the column and inside the payload), 4 event ids, outbox id
        "entity tenant": 1,
        "entity idempotency key": 1,  # per parameter, however often the SQL uses it
        "per-transaction digest (bytes)": 1,
        "timestamp (now() + offset)": 2,  # deadline, now
        "timestamp text (now() + offset)": 1,  # the deadline inside the JSON payload
    }
    text = create_script.text
    assert "(('own-key-' || :idx::text || '-end'))" in text
    assert "(CASE (:idx::bigint % 2) WHEN 0 THEN " in text
    assert "substring(sha256(convert_to(:idx::text || '.b0', 'UTF8')) from 1 for 32)" in text
    assert "(now() + '-0.030000 seconds'::interval)" in text
    assert "(now() + '3599.970000 seconds'::interval)" in text


def test_a_generated_id_is_one_variable_everywhere(create_script: Any) -> None:
    text = create_script.text
    task_var = "md5(:idx::text || '.0')"
    assert text.count(task_var) == 2  # the task id column and the payload's task_id
    values = text[text.index("VALUES (") :]
    assert values.startswith("VALUES (((lpad(to_hex(:tsn::bigint), 12, '0') || substr(" + task_var)
    assert "'{\"task_id\": \"' || ((lpad(to_hex(:tsn::bigint), 12, '0') || substr(" + task_var in text
    assert all(f"md5(:idx::text || '.{k}')" in text for k in range(6))  # task, 4 events, outbox
    assert "'.6'" not in text


def test_arrays_varying_become_array_constructors_constant_ones_stay_literals(create_script: Any) -> None:
    text = create_script.text
    m = re.search(r"unnest\((ARRAY\[.*?\]::uuid\[\])::uuid\[\]", text, re.S)
    assert m, text
    assert m.group(1).count("::uuid,") + m.group(1).count("::uuid]") == 4
    assert "'{created,validation_started,passed,queued}'::text[]" in text
    assert "'{NULL,CREATED,VALIDATING,RESERVED}'::text[]" in text
    assert "'{0,1,2,3}'::int2[]::bigint[]" in text


def test_json_with_quotes_colons_and_backslashes_is_pgbench_safe(create_script: Any) -> None:
    text = create_script.text
    # a constant Jsonb with a backslash: psycopg's E'' literal, its colons split from the letter after them
    assert "(E'{\"prompt\": \"a fox:' || E'red ''x'' \\\\\\\\ snow\", \"aspect_ratio\": \"16:9\"}')::jsonb" in text
    # the varying payload: split around the id and the timestamp, the cast on the whole
    assert '(\'{"task_id": "\' || ((lpad(' in text
    assert "|| '+00:00') || ('\", \"note\": \"key:' || 'value\"}'))::jsonb FROM task" in text
    for lit in re.findall(r"(?<![\w'])E?'(?:[^']|'')*'", text):
        assert not re.search(r":[A-Za-z_]", lit), lit  # nothing pgbench would read as a variable


def test_the_two_captures_must_send_the_same_statements() -> None:
    a = create_op(2, batch=1)
    b = op(3, tx(Stmt(LOCK, None, False, None), Stmt(CTE, create_params(3, T0), False, None)))
    with pytest.raises(BenchError, match="did not send the same statements"):
        render_script(a, b, literal, ENTITIES, title="t")


def test_pipeline_batch_numbers_only_matter_by_grouping() -> None:
    assert create_op(2, batch=5).signature() == create_op(3, batch=9).signature()
    split = op(3, tx(Stmt(LOCK, None, False, 1), Stmt(CTE, create_params(3, T0), False, 2)))
    assert split.signature() != create_op(2, batch=1).signature()
    sc = render_script(
        op(2, tx(Stmt(LOCK, None, False, 1), Stmt(CTE, create_params(2, T0), False, 2))),
        split,
        literal,
        ENTITIES,
        title="t",
    )
    assert body(sc.text).count("\\startpipeline") == 2 and sc.round_trips == 4


def test_rollback_and_autocommit_transactions_are_not_replayed() -> None:
    def one(i: int) -> Operation:
        return op(
            i,
            Tx(T0, [Stmt("SELECT 1", {}, False)], end="autocommit"),
            Tx(T0, [Stmt("DELETE FROM t", {}, False)], end="rollback"),
            tx(Stmt("UPDATE t SET a = %(a)s", {"a": 1}, False)),
        )

    sc = render_script(one(2), one(3), literal, [], title="t")
    assert body(sc.text) == ["BEGIN;", "UPDATE t SET a = 1;", "COMMIT;"]


# ------------------------------------------------------------------------------------------- statements
def render_one(sql_a: str, pa: Any, pb: Any, many: bool = False, entities: Any = (), i: int = 2) -> Any:
    return render_script(
        op(i, tx(Stmt(sql_a, pa, many))), op(i + 1, tx(Stmt(sql_a, pb, many))), literal, list(entities), title="t"
    )


def test_executemany_is_one_pipeline_one_round_trip() -> None:
    sc = render_one(
        "INSERT INTO e (id, v) VALUES (%(id)s, %(v)s)",
        [{"id": uuid.uuid4(), "v": k} for k in range(3)],
        [{"id": uuid.uuid4(), "v": k} for k in range(3)],
        many=True,
    )
    lines = body(sc.text)
    assert lines[1] == "\\startpipeline" and lines[-2] == "\\endpipeline" and len(lines) == 7
    assert sc.round_trips == 3 and sc.statements == 3 and sc.shape == [["INSERT e ×3"]]
    single = render_one("INSERT INTO e (v) VALUES (%(v)s)", [{"v": 1}], [{"v": 1}], many=True)
    assert "\\startpipeline" not in single.text and single.round_trips == 3


def test_placeholders_positional_binary_and_percent() -> None:
    sc = render_one("SELECT %s, %b, %t WHERE a LIKE 'x%%'", ("a", 1, True), ("a", 1, True))
    assert body(sc.text)[1] == "SELECT 'a', 1, true WHERE a LIKE 'x%';"
    named = render_one("SELECT %(a)b::int, %(a)s", {"a": 2}, {"a": 2})
    assert body(named.text)[1] == "SELECT 2::int, 2;"
    # without parameters psycopg sends the text as it is: a % is not a placeholder there
    raw = render_one("SELECT 'a%s' LIKE 'a%%'", None, None)
    assert body(raw.text)[1] == "SELECT 'a%s' LIKE 'a%%';"


def test_a_negative_value_after_a_minus_does_not_become_a_comment() -> None:
    sc = render_one("UPDATE t SET a = a -%(d)s", {"d": -5}, {"d": -5})
    assert body(sc.text)[1] == "UPDATE t SET a = a -(-5);"
    dec = render_one("UPDATE t SET a = a -%(d)s", {"d": Decimal("-1.5")}, {"d": Decimal("-1.5")})
    assert body(dec.text)[1] == "UPDATE t SET a = a -(-1.5);"


def test_quotes_colons_and_backslashes_in_text_parameters() -> None:
    sc = render_one(
        "SELECT %(a)s, %(b)s, %(c)s",
        {"a": "it's", "b": "wh:evt", "c": "a\\b:c"},
        {"a": "it's", "b": "wh:evt", "c": "a\\b:c"},
    )
    assert body(sc.text)[1] == "SELECT 'it''s', ('wh:' || 'evt'), (E'a\\\\b:' || E'c');"


# ------------------------------------------------------------------------------------------- classification
def classify(a: Any, b: Any, entities: Any = (), ia: int = 2, ib: int = 3) -> tuple[str, _Renderer]:
    r = _Renderer(literal, list(entities))
    return r.value(a, b, _Side(ia, T0), _Side(ib, T0 + timedelta(seconds=1)), "p"), r


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (5, 5, "5"),
        ("x", "x", "'x'"),
        (None, None, "NULL"),
        (True, True, "true"),
        (Decimal("1.50"), Decimal("1.50"), "1.50"),
        (b"\x01", b"\x01", literal(b"\x01")),
        ([1, 2], [1, 2], "'{1,2}'::int2[]"),
        (Jsonb({"a": 1}), Jsonb({"a": 1}), "'{\"a\": 1}'::jsonb"),
    ],
)
def test_equal_in_both_captures_is_the_literal_psycopg_sends(a: Any, b: Any, expected: str) -> None:
    expr, r = classify(a, b)
    assert expr == expected and not r.warnings


def test_entities_follow_idx() -> None:
    assert classify("own-key-2-end", "own-key-3-end", [KEY])[0] == "(('own-key-' || :idx::text || '-end'))"
    assert classify(1002, 1003, [int_entity("token", 1000)])[0] == "(1000 + :idx::bigint)"
    tenant = choice_entity("tenant", TENANTS, 2, 1)
    assert classify(TENANTS[0], TENANTS[1], [tenant])[0] == f"('{TENANTS[0].hex}')::uuid"


def test_generated_ids_and_hashes_are_per_transaction_variables() -> None:
    u1, u2, u3, u4 = (uuid.uuid4() for _ in range(4))
    r = _Renderer(literal, [])
    sa, sb = _Side(2, T0), _Side(3, T0)
    first, again, other = r.value(u1, u2, sa, sb, "a"), r.value(u1, u2, sa, sb, "b"), r.value(u3, u4, sa, sb, "c")
    assert first == again != other and first.endswith("::uuid") and "'.0'" in first and "'.1'" in other
    inside = r.value(f"reserve:{u1}", f"reserve:{u2}", sa, sb, "d")
    fresh0 = "(lpad(to_hex(:tsn::bigint), 12, '0') || substr(md5(:idx::text || '.0'), 1, 20))"
    assert inside == f"('reserve:' || ({fresh0})::uuid::text)"
    assert r.value(12345, 67890, sa, sb, "e") == "(:h0)::int" and r.hashes == {12345: ("h0", True)}
    assert r.value(2**40, 2**41, sa, sb, "f") == "(:h1)::bigint" and r.hashes[2**40] == ("h1", False)


def test_timestamps_become_now_plus_their_offset_from_begin() -> None:
    expr, _ = classify(T0 + timedelta(seconds=2), T0 + timedelta(seconds=3))
    assert expr == "(now() + '2.000000 seconds'::interval)"
    naive, _ = classify(T0.replace(tzinfo=None), T0.replace(tzinfo=None) + timedelta(seconds=1))
    assert naive == "(localtimestamp + '0.000000 seconds'::interval)"


def test_varying_arrays() -> None:
    u = [uuid.uuid4() for _ in range(4)]
    expr, r = classify([u[0], u[1]], [u[2], u[3]])
    assert expr.startswith("ARRAY[((lpad(") and expr.endswith(")::uuid]::uuid[]") and expr.count("::uuid") == 3
    ints, _ = classify([1002, 7], [1003, 7], [int_entity("token", 1000)])
    assert ints == "ARRAY[(1000 + :idx::bigint), 7]::int8[]"  # int2[] widened: the values now follow :idx
    keys, _ = classify([None, "own-key-2-end"], [None, "own-key-3-end"], [KEY])
    assert keys == "ARRAY[NULL, (('own-key-' || :idx::text || '-end'))]"
    nested, _ = classify([[1002, 1]], [[1003, 1]], [int_entity("token", 1000)])
    assert nested == "ARRAY[ARRAY[(1000 + :idx::bigint), 1]::int8[]]::int8[]"  # psycopg: '{{…}}'::int2[]
    short, r = classify([u[0]], [u[1], u[2]])
    assert short == literal([u[0]]) and "array of 1 vs 2 elements" in r.warnings[0]


def test_what_cannot_be_explained_is_replayed_as_captured_with_a_warning() -> None:
    for a, b in [(True, False), (Decimal("1.5"), Decimal("2.5")), ("red", "blue"), (None, "x")]:
        expr, r = classify(a, b)
        assert expr == literal(a) and len(r.warnings) == 1, (a, b)


def test_bytes_that_vary_become_a_digest_of_the_same_length() -> None:
    expr, r = classify(b"\x01" * 16, b"\x02" * 16)
    assert expr == "substring(sha256(convert_to(:idx::text || '.b0', 'UTF8')) from 1 for 16)"
    assert r.kinds["per-transaction digest (bytes)"] == 1


def test_json_that_varies_is_split_around_ids_and_timestamps() -> None:
    u1, u2 = uuid.uuid4(), uuid.uuid4()
    a = Jsonb({"id": str(u1), "at": T0.isoformat(), "q": "it's"})
    b = Jsonb({"id": str(u2), "at": (T0 + timedelta(seconds=1)).isoformat(), "q": "it's"})
    expr, r = classify(a, b)
    assert not r.warnings
    assert expr.startswith('(\'{"id": "\' || ((lpad(') and expr.endswith(' || \'", "q": "it\'\'s"}\')::jsonb')
    assert "to_char((now() + '0.000000 seconds'::interval) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')" in expr


# ------------------------------------------------------------------------------------------- pgbench_safe
@pytest.mark.parametrize(
    ("src", "out"),
    [
        ("SELECT 'wh:evt'", "SELECT ('wh:' || 'evt')"),
        ("SELECT 'a:b:c'::text", "SELECT ('a:' || 'b:' || 'c')::text"),
        ("SELECT 'x::y'", "SELECT ('x::' || 'y')"),
        ("SELECT '12:30', ':', 'a:1'", "SELECT '12:30', ':', 'a:1'"),
        ("SELECT 'it''s:x'", "SELECT ('it''s:' || 'x')"),
        ("SELECT E'a\\\\b:c\\'d'", "SELECT (E'a\\\\b:' || E'c\\'d')"),
        ("SELECT x::text, :idx, a::int[]", "SELECT x::text, :idx, a::int[]"),
    ],
)
def test_pgbench_safe(src: str, out: str) -> None:
    assert pgbench_safe(src, ALLOWED) == out


def test_pgbench_safe_refuses_unknown_variables_and_unterminated_literals() -> None:
    with pytest.raises(BenchError, match="':nope' outside a string literal"):
        pgbench_safe("SELECT :nope", ALLOWED)
    with pytest.raises(BenchError, match="unterminated"):
        pgbench_safe("SELECT 'abc", ALLOWED)


# ------------------------------------------------------------------------------------------- wire traces
# psycopg 3.3: conn.pipeline() with two prepared statements, a fetchone() inside the block, commit() after it.
# BEGIN is synced on its own; the fetch sends a Flush and waits; leaving the block sends a Sync and waits.
PIPELINE_TRACE = """F\t13\tParse\t "" "BEGIN" 0
F\t14\tBind\t "" "" 0 0 1 0
F\t6\tDescribe\t P ""
F\t9\tExecute\t "" 0
F\t4\tSync
B\t4\tParseComplete
B\t4\tBindComplete
B\t4\tNoData
B\t10\tCommandComplete\t "BEGIN"
B\t5\tReadyForQuery\t T
F\t20\tBind\t "" "_pg3_0" 0 0 1 0
F\t6\tDescribe\t P ""
F\t9\tExecute\t "" 0
F\t42\tBind\t "" "_pg3_1" 2 1 0 2 2 '\\x00\\x01' 8 '{x,NULL}' 1 0
F\t6\tDescribe\t P ""
F\t9\tExecute\t "" 0
F\t4\tFlush
B\t4\tBindComplete
B\t35\tRowDescription\t 1 "set_config" NNNN 0 NNNN 65535 -1 0
B\t16\tDataRow\t 1 6 '1500ms'
B\t13\tCommandComplete\t "SELECT 1"
B\t4\tBindComplete
B\t23\tDataRow\t 2 1 '2' 8 '{x,NULL}'
B\t13\tCommandComplete\t "SELECT 1"
F\t4\tSync
F\t4\tFlush
B\t5\tReadyForQuery\t T
F\t11\tQuery\t "COMMIT"
B\t11\tCommandComplete\t "COMMIT"
B\t5\tReadyForQuery\t I
"""


def test_a_pipeline_with_a_fetch_inside_costs_a_flush_wait_and_a_sync_wait() -> None:
    lines = PIPELINE_TRACE.splitlines()
    prepared = {
        "_pg3_0": LOCK,
        "_pg3_1": "WITH task AS (INSERT INTO tasks (a) VALUES ($1) RETURNING *) SELECT task.a FROM task",
    }
    assert trace_waits(lines, dict(prepared)) == [["BEGIN"], [LOCK, prepared["_pg3_1"]], [], ["COMMIT"]]
    labels = [sql_label(c) for c in parse_trace(lines, dict(prepared))]
    assert labels == [
        "BEGIN",
        "SELECT set_config lock_timeout + WITH (INSERT tasks) SELECT task",
        PIPELINE_SYNC,
        "COMMIT",
    ]
    assert ready_for_query(lines) == 3  # what counting ReadyForQuery alone would have said
    assert [len(s) for s in committed_segments(labels)] == [4]


def test_backend_messages_read_while_still_sending_are_not_a_wait() -> None:
    trace = """F\t50\tParse\t "s1" "INSERT INTO e (v) VALUES ($1)" 1 NNNN
F\t20\tBind\t "" "s1" 0 1 1 '1' 1 0
F\t9\tExecute\t "" 0
B\t4\tParseComplete
B\t4\tBindComplete
F\t20\tBind\t "" "s1" 0 1 1 '2' 1 0
F\t9\tExecute\t "" 0
F\t4\tSync
B\t4\tBindComplete
B\t15\tCommandComplete\t "INSERT 0 1"
B\t5\tReadyForQuery\t T
"""
    prepared: dict[str, str] = {}
    waits = trace_waits(trace.splitlines(), prepared)
    assert waits == [["INSERT INTO e (v) VALUES ($1)"] * 2]
    assert prepared == {"s1": "INSERT INTO e (v) VALUES ($1)"}
    assert sql_label(parse_trace(trace.splitlines(), {})[0]) == "INSERT e + INSERT e"


def test_unknown_prepared_statements_keep_their_name() -> None:
    trace = 'F\t20\tBind\t "" "_pg3_9" 0 0 1 0\nF\t9\tExecute\t "" 0\nF\t4\tSync\nB\t5\tReadyForQuery\t T\n'
    assert parse_trace(trace.splitlines(), {}) == ["prepared _pg3_9"]


@pytest.mark.parametrize(
    ("sql_text", "label"),
    [
        (LOCK, "SELECT set_config lock_timeout"),
        ("WITH a AS (SELECT 1 FROM x) SELECT * FROM a", "WITH … SELECT a"),
        (
            "WITH a AS (UPDATE t SET v = ')' RETURNING id), b AS MATERIALIZED (DELETE FROM u RETURNING 1) "
            "INSERT INTO log SELECT id FROM a",
            "WITH (UPDATE t, DELETE u) INSERT log",
        ),
        ("SELECT (SELECT count(*) FROM b) AS n, a.x FROM a WHERE a.y IN (SELECT y FROM c)", "SELECT a"),
        (f"BEGIN{FLIGHT_SEP}SELECT 1 FROM t", "BEGIN + SELECT t"),
        (PIPELINE_SYNC, PIPELINE_SYNC),
    ],
)
def test_sql_label(sql_text: str, label: str) -> None:
    assert sql_label(sql_text) == label


def test_committed_segments_with_pipelined_labels() -> None:
    seq = [
        "SELECT api_keys",
        "BEGIN",
        "SELECT set_config lock_timeout + WITH (INSERT t) SELECT t",
        PIPELINE_SYNC,
        "COMMIT",
        "BEGIN + SELECT x",
        "ROLLBACK",
        "BEGIN + UPDATE y + COMMIT",
    ]
    assert committed_segments(seq) == [seq[1:5], ["BEGIN + UPDATE y + COMMIT"]]
