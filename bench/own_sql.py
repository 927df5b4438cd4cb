"""Our own transaction, as pgbench replays it: the SQL the product sends, captured at run time.

The second baseline of `api_create` and `reducer` ("Two baselines") is pgbench running the
product's own transaction as one prepared script. Nothing here is a hand-copied version of today's SQL: the
benchmark drives the real code path (a POST through the app, the Dramatiq actor function) against a scratch
database, records every statement and its parameters at the driver (psycopg's `Cursor.execute` / `executemany`,
`Connection.commit` / `rollback` / `pipeline`, patched for the capture's duration: SQLAlchemy's statements and
those the product sends straight through the psycopg connection alike, each once), keeps the transactions that
COMMIT, and renders them as a pgbench script. New or removed statements, ON CONFLICT, data-modifying CTEs,
executemany batches and psycopg pipelines (both as `\\startpipeline … \\endpipeline`, one round trip): whatever
the product sends is what is replayed.

Parameters are rendered as psycopg would send them (`sql.Literal`: Jsonb as '…'::jsonb, lists as '{…}'::type[]);
a list whose elements vary becomes ARRAY[…]::type[] of its elements, each rendered like a parameter of its own.

Per-transaction unique values. The same operation is captured at least twice, on two different entity
indexes (say task 1 and task 2), and every parameter is compared between the two captures:

* equal in both → a constant (the literal the driver would send);
* a value the benchmark seeded as a function of the index (an idempotency key, a task id, a job id, a tenant
  chosen by index, a fencing token) → the same function of pgbench's per-transaction index `:idx`;
* any other UUID (a fresh id the product generated: task id, event ids, outbox id), whole or inside a string
  (canonical or 32-hex form, e.g. 'reserve:<task id>' or a JSON payload) → a per-transaction unique,
  time-ordered id derived from `:idx` (the same UUID everywhere in the transaction stays the same variable);
* a timestamp → now() plus the offset it had from the captured transaction's BEGIN;
* an integer → the entity's function of `:idx`, else a per-transaction hash (e.g. an advisory-lock key);
* bytes → a per-transaction digest of the same length.

What cannot be explained this way is replayed with the first capture's value and listed in `warnings`.

pgbench state. `:idx = :base + :client_id * :stride + :n`, with `-D base=… -D stride=… -D n=0 -D ts=<ms>`:
every client walks its own range, so no two transactions of a run (or of two runs with different bases) share
a key. `:tsn = :ts + :n` is the time prefix of generated ids (run start in ms, plus the client's counter), so
ids stay roughly time-ordered like the product's UUIDv7 and inserts stay at the right edge of the index.

`render_script`, `pgbench_safe`, `trace_waits` and `sql_label` are pure; `Recorder` and `WireCounter` need a
database.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import subprocess
import threading
import time
import uuid
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench.common import BenchError, Postgres, need_tool


# ------------------------------------------------------------------------------------------- capture
@dataclass
class Stmt:
    sql: str
    params: Any  # a dict or a sequence; for executemany a list of them
    many: bool
    pipeline: int | None = None  # the psycopg pipeline batch it was sent in (same number = same batch)


#: "implicit": one statement that writes, sent in autocommit — its own transaction (the API's loop create)
_COMMITTED = ("commit", "implicit")
_WRITES = re.compile(r"\b(INSERT|UPDATE|DELETE|MERGE)\b", re.IGNORECASE)


@dataclass
class Tx:
    began_at: datetime
    stmts: list[Stmt] = field(default_factory=list)
    end: str = "open"  # commit | implicit | rollback | failed | autocommit | unknown | open


@dataclass
class Operation:
    """One product operation (a POST, an event through the actor...) and the transactions it ran."""

    index: int
    label: str
    txs: list[Tx] = field(default_factory=list)
    checkouts: int = 0
    wire: list[str] = field(default_factory=list)  # one label per round trip (libpq trace)

    def committed(self) -> list[Tx]:
        return [t for t in self.txs if t.end in _COMMITTED and t.stmts]

    def signature(self) -> tuple[Any, ...]:
        return tuple(
            tuple(
                (s.sql, s.many, len(s.params) if s.many else 1, batch)
                for s, batch in zip(t.stmts, _batches(t.stmts), strict=True)
            )
            for t in self.committed()
        )


def _batches(stmts: Sequence[Stmt]) -> list[int | None]:
    """Pipeline batch numbers renumbered 0, 1, ... in order of appearance (None: not in a pipeline)."""
    seen: dict[int, int] = {}
    return [None if s.pipeline is None else seen.setdefault(s.pipeline, len(seen)) for s in stmts]


@dataclass
class _ConnState:
    tx: Tx | None = None
    depth: int = 0  # psycopg pipeline nesting
    batch: int | None = None
    explicit: bool = False  # a transaction opened by a BEGIN statement in autocommit


def _query_text(query: Any, conn: Any) -> str:
    if isinstance(query, str):
        return query
    if isinstance(query, (bytes, bytearray, memoryview)):
        return bytes(query).decode()
    if hasattr(query, "as_string"):  # psycopg.sql.Composable
        return str(query.as_string(conn))
    return str(query)


class Recorder:
    """Every statement one engine's connections send, with its parameters, grouped into transactions, grouped
    into operations (`with recorder.operation(i, label): ...`). Outside an operation nothing is kept.

    Hooked at the driver, below SQLAlchemy: `psycopg.Cursor.execute` / `executemany` (which SQLAlchemy calls,
    and `Connection.execute` too), `Connection.commit` / `rollback` (SQLAlchemy's COMMIT and direct ones alike),
    `Connection.pipeline` and `Pipeline.sync` (batches). So SQL the product sends straight through the psycopg
    connection (`sa_conn.connection.driver_connection`) is recorded as well as SQLAlchemy's, each statement once
    (a thread-local guard keeps a call psycopg makes inside another from counting twice). The patches are in
    place only inside `operation()`; only connections the engine's pool handed out (its checkout event) count,
    and those of the API's async loop pool (`psycopg.AsyncCursor.execute`, `AsyncConnectionPool.getconn`).

    Transactions follow psycopg: a statement on a connection outside autocommit with no transaction open starts
    one (psycopg sends BEGIN before it), commit() / rollback() end it; a statement in autocommit is its own
    transaction: "implicit" when it writes (replayed without BEGIN and COMMIT, as the server ran it), else
    "autocommit" (a read, not replayed). A transaction that ended unseen (the server side is idle again
    when the next statement comes) is marked "unknown" and not replayed either."""

    def __init__(self, engine: Any) -> None:
        import sqlalchemy as sa

        self._lock = threading.RLock()
        self._conns: weakref.WeakSet[Any] = weakref.WeakSet()
        self._state: dict[int, _ConnState] = {}
        self._cur: Operation | None = None
        self._batch_no = 0
        self._guard = threading.local()
        self._saved: list[tuple[type, str, Any]] = []
        self.ops: list[Operation] = []
        sa.event.listen(engine, "checkout", self._checkout)

    # --- psycopg patches, for the duration of an operation
    def _install(self) -> None:
        import psycopg

        rec = self

        def guarded(call: Callable[[], Any]) -> Any:
            rec._guard.depth = getattr(rec._guard, "depth", 0) + 1
            try:
                return call()
            finally:
                rec._guard.depth -= 1

        orig_exec, orig_many = psycopg.Cursor.__dict__["execute"], psycopg.Cursor.__dict__["executemany"]
        orig_commit, orig_rollback = psycopg.Connection.__dict__["commit"], psycopg.Connection.__dict__["rollback"]
        orig_pipeline, orig_sync = psycopg.Connection.__dict__["pipeline"], psycopg.Pipeline.__dict__["sync"]

        def execute(cur: Any, query: Any, params: Any = None, *args: Any, **kw: Any) -> Any:
            rec._stmt(cur.connection, query, params, False)
            return guarded(lambda: orig_exec(cur, query, params, *args, **kw))

        def executemany(cur: Any, query: Any, params_seq: Any, *args: Any, **kw: Any) -> Any:
            rows = list(params_seq)
            rec._stmt(cur.connection, query, rows, True)
            return guarded(lambda: orig_many(cur, query, rows, *args, **kw))

        def ender(orig: Any, how: str) -> Any:
            def end(conn: Any) -> Any:
                try:
                    res = guarded(lambda: orig(conn))
                except BaseException:
                    rec._end(conn, "failed")
                    raise
                rec._end(conn, how)
                return res

            return end

        @contextlib.contextmanager
        def pipeline(conn: Any) -> Any:
            rec._pipe(conn, +1)
            try:
                with orig_pipeline(conn) as p:
                    yield p
            finally:
                rec._pipe(conn, -1)

        def sync(p: Any) -> Any:
            rec._pipe(p._conn, 0)
            return orig_sync(p)

        from psycopg_pool import AsyncConnectionPool

        orig_aexec = psycopg.AsyncCursor.__dict__["execute"]
        orig_getconn = AsyncConnectionPool.__dict__["getconn"]

        async def aexecute(cur: Any, query: Any, params: Any = None, *args: Any, **kw: Any) -> Any:
            rec._stmt(cur.connection, query, params, False)
            return await orig_aexec(cur, query, params, *args, **kw)

        async def getconn(pool: Any, *args: Any, **kw: Any) -> Any:
            conn = await orig_getconn(pool, *args, **kw)
            rec._checkout(conn)
            return conn

        for cls, name, fn in (
            (psycopg.AsyncCursor, "execute", aexecute),
            (AsyncConnectionPool, "getconn", getconn),
            (psycopg.Cursor, "execute", execute),
            (psycopg.Cursor, "executemany", executemany),
            (psycopg.Connection, "commit", ender(orig_commit, "commit")),
            (psycopg.Connection, "rollback", ender(orig_rollback, "rollback")),
            (psycopg.Connection, "pipeline", pipeline),
            (psycopg.Pipeline, "sync", sync),
        ):
            self._saved.append((cls, name, cls.__dict__[name]))
            setattr(cls, name, fn)

    def _uninstall(self) -> None:
        while self._saved:
            cls, name, fn = self._saved.pop()
            setattr(cls, name, fn)

    # --- what the patches report
    def _mine(self, conn: Any) -> bool:
        return self._cur is not None and conn in self._conns and not getattr(self._guard, "depth", 0)

    def _stmt(self, conn: Any, query: Any, params: Any, many: bool) -> None:
        with self._lock:
            if not self._mine(conn):
                return
            st = self._state.setdefault(id(conn), _ConnState())
            stmt = Stmt(_query_text(query, conn), params, many, st.batch if st.depth else None)
            if conn.autocommit:
                # the product's hot paths run in autocommit and send BEGIN / COMMIT as statements in pipelines
                word = stmt.sql.strip().rstrip(";").upper()
                if word == "BEGIN":
                    st.tx = Tx(datetime.now(UTC))
                    self._cur.txs.append(st.tx)  # type: ignore[union-attr]
                    st.explicit = True
                    return
                if st.explicit and st.tx is not None:
                    if word in ("COMMIT", "ROLLBACK"):
                        st.tx.end, st.tx, st.explicit = word.lower(), None, False
                    else:
                        st.tx.stmts.append(stmt)
                    return
                end = "implicit" if _WRITES.search(stmt.sql) else "autocommit"
                self._cur.txs.append(Tx(datetime.now(UTC), [stmt], end=end))  # type: ignore[union-attr]
                return
            if st.tx is not None and not st.depth:
                from psycopg import pq

                if conn.pgconn.transaction_status == pq.TransactionStatus.IDLE:  # ended without commit()/rollback()
                    st.tx.end, st.tx = "unknown", None
            if st.tx is None:
                st.tx = Tx(datetime.now(UTC))
                self._cur.txs.append(st.tx)  # type: ignore[union-attr]
            st.tx.stmts.append(stmt)

    def _end(self, conn: Any, how: str) -> None:
        with self._lock:
            if not self._mine(conn):
                return
            st = self._state.get(id(conn))
            if st is not None and st.tx is not None:
                st.tx.end, st.tx = how, None

    def _pipe(self, conn: Any, step: int) -> None:
        """step +1: entering a pipeline, -1: leaving it, 0: Pipeline.sync() (the next statements are a new batch)."""
        with self._lock:
            if not self._mine(conn):
                return
            st = self._state.setdefault(id(conn), _ConnState())
            if step > 0 and st.depth == 0 or step == 0:
                self._batch_no += 1
                st.batch = self._batch_no
            st.depth = max(0, st.depth + step)

    def _checkout(self, dbapi_conn: Any, *_: Any) -> None:
        with self._lock:
            self._conns.add(dbapi_conn)
            if self._cur is not None:
                self._cur.checkouts += 1

    def operation(self, index: int, label: str) -> _OpScope:
        return _OpScope(self, index, label)


class _OpScope:
    def __init__(self, rec: Recorder, index: int, label: str) -> None:
        self.rec, self.op = rec, Operation(index, label)

    def __enter__(self) -> Operation:
        with self.rec._lock:
            self.rec._cur = self.op
            self.rec._state.clear()
            self.rec._install()
        return self.op

    def __exit__(self, *exc: Any) -> None:
        with self.rec._lock:
            self.rec._uninstall()
            self.rec._cur = None
            self.rec._state.clear()
        self.rec.ops.append(self.op)


def choose_structure(ops: Sequence[Operation], label: str, need: int = 2) -> list[Operation]:
    """The operations of `label` whose committed transactions have the most common shape (same statements in
    the same order), at least `need` of them. Time-cached reads (e.g. the backlog gate's once-a-second query)
    make the odd operation differ; the steady-state shape is the one most operations have."""
    mine = [o for o in ops if o.label == label]
    if not mine:
        raise BenchError(f"capture: no {label} operation recorded")
    counts = Counter(o.signature() for o in mine)
    sig, n = max(counts.items(), key=lambda kv: (kv[1], max(i for i, o in enumerate(mine) if o.signature() == kv[0])))
    if n < need:
        raise BenchError(
            f"capture: {label}: no two operations sent the same transactions "
            f"({len(counts)} different shapes in {len(mine)} operations)"
        )
    if not sig or not any(sig):
        raise BenchError(f"capture: {label}: the operation committed no statement")
    return [o for o in mine if o.signature() == sig]


# ------------------------------------------------------------------------------------------- entities
@dataclass(frozen=True)
class Entity:
    """A value the benchmark seeded as a function of an integer index, and the same function in SQL.

    kind: "uuid" (value: uuid.UUID; sql: a text expression of its 32 hex digits), "text" (value: str; sql: a
    text expression), "int" (value: int; sql: an integer expression), "bytes" (value: bytes; sql: bytea)."""

    name: str
    kind: str
    value: Callable[[int], Any]
    sql: Callable[[str], str]


def md5_uuid(text: str) -> uuid.UUID:
    return uuid.UUID(hex=hashlib.md5(text.encode()).hexdigest())


def md5_uuid_entity(name: str, prefix: str) -> Entity:
    """uuid = md5(prefix || i): seedable in SQL as md5('prefix' || i)::uuid."""
    return Entity(name, "uuid", lambda i: md5_uuid(f"{prefix}{i}"), lambda ix: f"md5({q(prefix)} || {ix}::text)")


def text_entity(name: str, prefix: str, suffix: str = "", md5: bool = False) -> Entity:
    """prefix || i || suffix, or prefix || md5(tag || i) with md5=True (then `suffix` is the md5 tag)."""
    if md5:
        return Entity(
            name,
            "text",
            lambda i: prefix + hashlib.md5(f"{suffix}{i}".encode()).hexdigest(),
            lambda ix: f"({q(prefix)} || md5({q(suffix)} || {ix}::text))",
        )
    return Entity(
        name,
        "text",
        lambda i: f"{prefix}{i}{suffix}",
        lambda ix: f"({q(prefix)} || {ix}::text" + (f" || {q(suffix)})" if suffix else ")"),
    )


def int_entity(name: str, offset: int) -> Entity:
    return Entity(name, "int", lambda i: offset + i, lambda ix: f"({offset} + {ix}::bigint)")


def choice_entity(name: str, values: Sequence[uuid.UUID], capture_n: int, script_n: int) -> Entity:
    """values[i % capture_n] at capture time; values[i % script_n] in the script (a CASE over the index)."""
    vals = list(values)

    def sql(ix: str) -> str:
        if script_n == 1:
            return q(vals[0].hex)
        arms = " ".join(f"WHEN {k} THEN {q(v.hex)}" for k, v in enumerate(vals[:script_n]))
        return f"(CASE ({ix}::bigint % {script_n}) {arms} END)"

    return Entity(name, "uuid", lambda i: vals[i % capture_n], sql)


# ------------------------------------------------------------------------------------------- rendering
#: what pgbench would read as a variable reference after a colon
_VAR_AFTER_COLON = re.compile(r"[A-Za-z_\u0080-\U0010ffff]")
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_HEX32 = r"(?<![0-9a-fA-F])[0-9a-f]{32}(?![0-9a-fA-F])"
_TS = r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?(?:[+-]\d{2}:\d{2}|Z)?"
_LITERAL = re.compile(r"^\s*(E?)'((?:[^']|'')*)'((?:::[\w ]+(?:\[\])?)?)\s*$", re.S)
#: psycopg placeholders: %(name)s / %s, and their binary (b) and text (t) variants; %% is a literal %
_PLACEHOLDER = re.compile(r"%\(([^)]+)\)[sbt]|%%|%[sbt]")
_ARRAY_CAST = re.compile(r"(::[\w ]+(?:\[\])+)$")


def q(text: str) -> str:
    """A standard SQL string literal (pgbench-safe once it goes through `pgbench_safe`)."""
    return "'" + text.replace("'", "''") + "'"


def pgbench_safe(sql: str, allowed: set[str]) -> str:
    """Make SQL text safe for a pgbench script: a colon followed by a letter inside a string literal would be
    read as a variable reference (`'wh:evt'` → `:evt`), so such literals are split at the colon and
    concatenated again (`('wh:' || 'evt')`, parenthesized so a following cast still applies to the whole).
    Outside literals every `:name` must be one of `allowed`; `::` casts are left alone."""
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c == "'":
            e = (
                bool(out)
                and out[-1] in ("E", "e")
                and (len(out) < 2 or not (out[-2][-1:].isalnum() or out[-2][-1:] == "_"))
            )
            j, body = i + 1, []
            while True:
                if j >= n:
                    raise BenchError(f"unterminated string literal in SQL: {sql[i : i + 80]!r}")
                ch = sql[j]
                if e and ch == "\\":
                    body.append(sql[j : j + 2])
                    j += 2
                    continue
                if ch == "'":
                    if j + 1 < n and sql[j + 1] == "'":
                        body.append("''")
                        j += 2
                        continue
                    break
                body.append(ch)
                j += 1
            text = "".join(body)
            pieces, start = [], 0
            for m in re.finditer(r":(?=" + _VAR_AFTER_COLON.pattern + ")", text):
                pieces.append(text[start : m.end()])
                start = m.end()
            pieces.append(text[start:])
            if len(pieces) == 1:
                out.append("'" + text + "'")
            else:
                if e:
                    out.pop()
                pre = "E" if e else ""
                out.append("(" + " || ".join(f"{pre}'{p}'" for p in pieces) + ")")
            i = j + 1
            continue
        if c == ":":
            if i + 1 < n and sql[i + 1] == ":":
                while i < n and sql[i] == ":":
                    out.append(":")
                    i += 1
                continue
            var = re.match(r"[A-Za-z_][A-Za-z0-9_]*", sql[i + 1 :])
            if var and var.group(0) not in allowed:
                raise BenchError(
                    f"SQL has ':{var.group(0)}' outside a string literal; pgbench would read it as a "
                    f"variable: {sql[max(0, i - 60) : i + 40]!r}"
                )
        out.append(c)
        i += 1
    return "".join(out)


@dataclass
class _Side:
    """What one capture contributes to the comparison: its entity index and the BEGIN time of the current tx."""

    index: int
    began_at: datetime


class _Renderer:
    def __init__(self, literal: Callable[[Any], str], entities: Sequence[Entity]) -> None:
        self.literal = literal
        self.entities = list(entities)
        self.fresh: dict[uuid.UUID, tuple[int, uuid.UUID]] = {}  # capture-1 uuid -> (var number, capture-2 uuid)
        self.hashes: dict[int, tuple[str, bool]] = {}  # capture-1 int -> (var name, fits int32)
        self.warnings: list[str] = []
        self.kinds: Counter[str] = Counter()

    # --- the variable parts
    def fresh_hex(self, a: uuid.UUID, b: uuid.UUID, where: str) -> str:
        if a not in self.fresh:
            self.fresh[a] = (len(self.fresh), b)
        k, b0 = self.fresh[a]
        if b0 != b:
            self.warnings.append(f"{where}: id {a} pairs with two different ids in the second capture")
        self.kinds["generated id"] += 1
        return f"(lpad(to_hex(:tsn::bigint), 12, '0') || substr(md5(:idx::text || '.{k}'), 1, 20))"

    def uuid_hex(self, a: uuid.UUID, b: uuid.UUID, sa: _Side, sb: _Side, where: str) -> str:
        for e in self.entities:
            if e.kind == "uuid" and e.value(sa.index) == a and e.value(sb.index) == b:
                self.kinds[f"entity {e.name}"] += 1
                return e.sql(":idx")
        return self.fresh_hex(a, b, where)

    def int_expr(self, a: int, b: int, sa: _Side, sb: _Side, where: str) -> str:
        for e in self.entities:
            if e.kind == "int" and e.value(sa.index) == a and e.value(sb.index) == b:
                self.kinds[f"entity {e.name}"] += 1
                return e.sql(":idx")
        if a not in self.hashes:
            small = all(-(2**31) <= v < 2**31 for v in (a, b))
            self.hashes[a] = (f"h{len(self.hashes)}", small)
        name, small = self.hashes[a]
        self.kinds["per-transaction hash (int)"] += 1
        return f"(:{name})::{'int' if small else 'bigint'}"

    def ts_expr(self, a: datetime, sa: _Side) -> str:
        base = sa.began_at if a.tzinfo is not None else sa.began_at.replace(tzinfo=None)
        delta = (a - base).total_seconds()
        self.kinds["timestamp (now() + offset)"] += 1
        clock = "now()" if a.tzinfo is not None else "localtimestamp"
        return f"({clock} + '{delta:.6f} seconds'::interval)"

    def ts_text(self, a: str, b: str, sa: _Side, where: str) -> str | None:
        m = re.fullmatch(r"(\d{4}-\d{2}-\d{2})([T ])(\d{2}:\d{2}:\d{2})(\.\d{1,6})?([+-]\d{2}:\d{2}|Z)?", a)
        if not m:
            return None
        tz = m.group(5)
        if tz not in (None, "Z", "+00:00"):
            return None
        try:
            dt = datetime.fromisoformat(a.replace("Z", "+00:00"))
        except ValueError:
            return None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=UTC)
        delta = (dt - sa.began_at).total_seconds()
        fmt = "YYYY-MM-DD" + ('"T"' if m.group(2) == "T" else " ") + "HH24:MI:SS" + (".US" if m.group(4) else "")
        digits = len(m.group(4)) - 1 if m.group(4) else 0
        expr = f"to_char((now() + '{delta:.6f} seconds'::interval) AT TIME ZONE 'UTC', {q(fmt)})"
        if digits and digits != 6:
            expr = f"substr({expr}, 1, {20 + digits})"
        self.kinds["timestamp text (now() + offset)"] += 1
        return f"({expr}" + (f" || {q(tz)})" if tz else ")")

    # --- one parameter
    def value(self, a: Any, b: Any, sa: _Side, sb: _Side, where: str) -> str:
        la, lb = self.literal(a), self.literal(b)
        if isinstance(a, bool) or a is None or b is None or type(a) is not type(b):
            if la != lb:
                self.warnings.append(f"{where}: {la[:60]} vs {lb[:60]} in the second capture; replayed as captured")
            return la
        if isinstance(a, int):
            for e in self.entities:  # an entity that happens to be constant still follows the index
                if e.kind == "int" and e.value(sa.index) == a and e.value(sb.index) == b and a != b:
                    return self.int_expr(a, b, sa, sb, where)
            return la if a == b else self.int_expr(a, b, sa, sb, where)
        if isinstance(a, uuid.UUID):
            for e in self.entities:
                if e.kind == "uuid" and e.value(sa.index) == a and e.value(sb.index) == b:
                    self.kinds[f"entity {e.name}"] += 1
                    return f"({e.sql(':idx')})::uuid"
            return la if a == b else f"({self.fresh_hex(a, b, where)})::uuid"
        if la == lb:
            return la
        if isinstance(a, (list, tuple)):
            return self.array(a, b, la, lb, sa, sb, where)
        if isinstance(a, datetime):
            return self.ts_expr(a, sa)
        raw_a, raw_b = _raw_bytes(a), _raw_bytes(b)
        if raw_a is not None and raw_b is not None:
            for e in self.entities:
                if e.kind == "bytes" and e.value(sa.index) == raw_a and e.value(sb.index) == raw_b:
                    self.kinds[f"entity {e.name}"] += 1
                    return e.sql(":idx")
            if len(raw_a) == len(raw_b) <= 32:
                k = self.kinds["per-transaction digest (bytes)"]
                self.kinds["per-transaction digest (bytes)"] += 1
                return f"substring(sha256(convert_to(:idx::text || '.b{k}', 'UTF8')) from 1 for {len(raw_a)})"
        if isinstance(a, (Decimal, float, date)) and not isinstance(a, datetime):
            self.warnings.append(f"{where}: {la} vs {lb} in the second capture; replayed as captured")
            return la
        expr = self.templated(la, lb, sa, sb, where)
        if expr is None:
            self.warnings.append(
                f"{where}: differs between the captures in a way not explained by ids, keys or "
                f"timestamps; replayed as captured: {la[:100]}"
            )
            return la
        return expr

    def array(self, a: Sequence[Any], b: Sequence[Any], la: str, lb: str, sa: _Side, sb: _Side, where: str) -> str:
        """A list parameter that differs between the captures: ARRAY[...] of its elements, each rendered like a
        parameter of its own (so a fresh id in an array is the same variable as elsewhere), with the array cast
        psycopg's literal had (e.g. '{…}'::uuid[] → ARRAY[…]::uuid[]; int2[]/int4[] widened to int8[], since the
        values now follow :idx); the statement's own cast still applies."""
        if len(a) != len(b) or not a:
            self.warnings.append(
                f"{where}: array of {len(a)} vs {len(b)} elements in the second capture; replayed as "
                f"captured: {la[:100]}"
            )
            return la
        elems = [self.value(x, y, sa, sb, f"{where}[{k}]") for k, (x, y) in enumerate(zip(a, b, strict=True))]
        m = _ARRAY_CAST.search(la)
        cast = m.group(1) if m else ""
        if re.fullmatch(r"::int[24](\[\])+", cast):  # psycopg picks the smallest type for the captured values
            cast = "::int8" + cast[len("::int2") :]
        return "ARRAY[" + ", ".join(elems) + "]" + cast

    def templated(self, la: str, lb: str, sa: _Side, sb: _Side, where: str) -> str | None:
        """A string literal whose differences between the captures are ids, entity strings or timestamps:
        the literal split around them and concatenated with their expressions."""
        ma, mb = _LITERAL.match(la), _LITERAL.match(lb)
        if not (ma and mb) or ma.group(1) != mb.group(1) or ma.group(3) != mb.group(3):
            return None
        e_prefix, cast = ma.group(1), ma.group(3)
        pa, pb = self.tokenize(ma.group(2), sa.index), self.tokenize(mb.group(2), sb.index)
        if len(pa) != len(pb):
            return None
        parts: list[str] = []
        lit = ""
        changed = False
        for (ka, ta), (kb, tb) in zip(pa, pb, strict=False):
            if ka != kb:
                return None
            if ka == "lit" or ta == tb:
                if ka == "lit" and ta != tb:
                    return None
                lit += ta
                continue
            if ka.startswith("e:"):
                ent = next(e for e in self.entities if e.name == ka[2:])
                self.kinds[f"entity {ent.name}"] += 1
                expr = ent.sql(":idx")
            elif ka in ("uuid", "hex"):
                hexpr = self.uuid_hex(uuid.UUID(ta), uuid.UUID(tb), sa, sb, where)
                expr = f"({hexpr})::uuid::text" if ka == "uuid" else hexpr
            elif ka == "ts":
                ts = self.ts_text(ta, tb, sa, where)
                if ts is None:
                    return None
                expr = ts
            else:
                return None
            if lit:
                parts.append(f"{e_prefix}'{lit}'")
                lit = ""
            parts.append(expr)
            changed = True
        if lit:
            parts.append(f"{e_prefix}'{lit}'")
        if not changed:
            return la
        return "(" + " || ".join(parts) + ")" + cast

    def tokenize(self, body: str, index: int) -> list[tuple[str, str]]:
        alts = []
        texts = sorted(((e.value(index), e.name) for e in self.entities if e.kind == "text"), key=lambda t: -len(t[0]))
        for k, (v, _) in enumerate(texts):
            alts.append(f"(?P<e{k}>{re.escape(v.replace(chr(39), chr(39) * 2))})")
        alts += [f"(?P<uuid>{_UUID})", f"(?P<hex>{_HEX32})", f"(?P<ts>{_TS})"]
        out: list[tuple[str, str]] = []
        pos = 0
        for m in re.finditer("|".join(alts), body):
            if m.start() > pos:
                out.append(("lit", body[pos : m.start()]))
            kind = m.lastgroup or "lit"
            if kind.startswith("e") and kind[1:].isdigit():
                kind = "e:" + texts[int(kind[1:])][1]
            out.append((kind, m.group(0)))
            pos = m.end()
        if pos < len(body):
            out.append(("lit", body[pos:]))
        return out


class Literals:
    """Python value → the SQL literal psycopg would send for it (its own adapters, on a real connection)."""

    def __init__(self, conninfo: str) -> None:
        import psycopg

        self.conn = psycopg.connect(conninfo, autocommit=True)

    def __call__(self, value: Any) -> str:
        from psycopg import sql

        return sql.Literal(value).as_string(self.conn).strip()

    def close(self) -> None:
        self.conn.close()


def _raw_bytes(v: Any) -> bytes | None:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    obj = getattr(v, "obj", None)  # psycopg.Binary
    if type(v).__name__ == "Binary" and isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj)
    return None


def _leaves(params: Any) -> list[tuple[str, Any]]:
    if isinstance(params, dict):
        return list(params.items())
    if params is None:
        return []
    return [(str(k), v) for k, v in enumerate(params)]


def _substitute(sql: str, exprs: dict[str, str], positional: list[str]) -> str:
    it = iter(positional)

    def rep(m: re.Match[str]) -> str:
        if m.group(0) == "%%":
            return "%"
        expr = exprs[m.group(1)] if m.group(1) is not None else next(it)
        return f"({expr})" if expr.startswith("-") else expr  # -%(x)s with x = -5 would be --5, a comment

    return _PLACEHOLDER.sub(rep, sql)


def _render_stmt(r: _Renderer, sa_: Stmt, sb_: Stmt, side_a: _Side, side_b: _Side, where: str) -> list[str]:
    """One captured statement (both captures) as pgbench SQL lines, one per row of an executemany."""
    rows_a = sa_.params if sa_.many else [sa_.params]
    rows_b = sb_.params if sb_.many else [sb_.params]
    if len(rows_a) != len(rows_b):
        raise BenchError(f"render: {where}: {len(rows_a)} vs {len(rows_b)} rows in the two captures")
    out = []
    for row, (pa, pb) in enumerate(zip(rows_a, rows_b, strict=True)):
        if pa is None:  # no parameters: psycopg sends the text as it is (a % is not a placeholder then)
            out.append(sa_.sql.strip().rstrip(";") + ";")
            continue
        la, lb = _leaves(pa), _leaves(pb)
        if [k_ for k_, _ in la] != [k_ for k_, _ in lb]:
            raise BenchError(f"render: {where}: parameter names differ between the captures")
        exprs = {}
        for (name, va), (_, vb) in zip(la, lb, strict=True):
            exprs[name] = r.value(va, vb, side_a, side_b, f"{where} row {row} {name}")
        positional = [exprs[str(i)] for i in range(len(la))] if not isinstance(pa, dict) else []
        out.append(_substitute(sa_.sql, exprs, positional).strip().rstrip(";") + ";")
    return out


@dataclass
class Script:
    """A rendered pgbench script and what went into it."""

    text: str
    transactions: int  # per script execution, optional ones counted once
    statements: int
    round_trips: int  # pgbench round trips per execution: BEGIN, each statement (a pipeline is one), COMMIT
    optional: dict[int, float]
    variables: dict[str, int]
    warnings: list[str]
    shape: list[list[str]]  # per transaction: a label per round trip (a pipeline's statements joined by +)
    tx_round_trips: list[int] = field(default_factory=list)  # per transaction, BEGIN and COMMIT included

    def as_dict(self) -> dict[str, Any]:
        return {
            "transactions": self.transactions,
            "statements": self.statements,
            "round_trips": self.round_trips,
            "tx_round_trips": self.tx_round_trips,
            "optional_transactions": {str(k): v for k, v in self.optional.items()},
            "how_values_vary": self.variables,
            "warnings": self.warnings,
            "shape": self.shape,
            "script": self.text,
        }


def render_script(
    a: Operation,
    b: Operation,
    literal: Callable[[Any], str],
    entities: Sequence[Entity],
    *,
    title: str,
    optional: dict[int, float] | None = None,
) -> Script:
    """The committed transactions of `a` (checked against `b`, the same operation on another index) as one
    pgbench script. `optional` maps a transaction's position to the probability it runs in an execution (e.g.
    a re-delivery); `literal` renders a Python value as the driver would (psycopg's sql.Literal)."""
    ta, tb = a.committed(), b.committed()
    if a.signature() != b.signature():
        raise BenchError("render: the two captures did not send the same statements")
    optional = optional or {}
    r = _Renderer(literal, entities)
    body: list[str] = []
    shape: list[list[str]] = []
    statements = round_trips = 0
    tx_rts: list[int] = []
    for k, (xa, xb) in enumerate(zip(ta, tb, strict=False)):
        before = round_trips
        if k in optional:
            body.append(f"\\if :opt{k} <= {round(optional[k] * 1_000_000)}")
        implicit = xa.end == "implicit"
        if not implicit:
            body.append("BEGIN;")
            round_trips += 2
        labels = []
        side_a, side_b = _Side(a.index, xa.began_at), _Side(b.index, xb.began_at)
        pairs = list(zip(xa.stmts, xb.stmts, strict=True))
        batches = _batches(xa.stmts)
        s = 0
        while s < len(pairs):  # one round trip: a statement, an executemany, or a pipeline batch
            e = s + 1
            while batches[s] is not None and e < len(pairs) and batches[e] == batches[s]:
                e += 1
            group: list[str] = []
            group_labels = []
            for j in range(s, e):
                sa_, sb_ = pairs[j]
                rows = _render_stmt(r, sa_, sb_, side_a, side_b, f"tx {k} stmt {j}")
                group += rows
                group_labels.append(sql_label(sa_.sql) + (f" ×{len(rows)}" if sa_.many else ""))
            labels.append(" + ".join(group_labels))
            statements += len(group)
            round_trips += 1
            # a psycopg pipeline, or an executemany (psycopg sends it as one pipeline): one round trip
            if batches[s] is not None or len(group) > 1:
                body += ["\\startpipeline", *group, "\\endpipeline"]
            else:
                body += group
            s = e
        if not implicit:
            body.append("COMMIT;")
        if k in optional:
            body.append("\\endif")
        shape.append(labels)
        tx_rts.append(round_trips - before)
    head = [f"-- {line}" for line in title.splitlines()]
    head += [
        "-- pgbench -n -M prepared -D base=B -D stride=S -D n=0 -D ts=<ms> ...  (each client walks its own range "
        "of :idx)",
        "\\set idx :base + :client_id * :stride + :n",
        "\\set tsn :ts + :n",
        "\\set n :n + 1",
    ]
    for k, (name, small) in enumerate(r.hashes.values()):
        head.append(
            f"\\set {name} " + (f"abs(hash(:idx, {1000 + k})) % 2147483647" if small else f"hash(:idx, {1000 + k})")
        )
    for k in optional:
        head.append(f"\\set opt{k} random(1, 1000000)")
    allowed = {
        "idx",
        "tsn",
        "n",
        "base",
        "stride",
        "ts",
        "client_id",
        *(n for n, _ in r.hashes.values()),
        *(f"opt{k}" for k in optional),
    }
    text = (
        "\n".join(head + [pgbench_safe(line, allowed) if not line.startswith("\\") else line for line in body]) + "\n"
    )
    return Script(
        text=text,
        transactions=len(ta),
        statements=statements,
        round_trips=round_trips,
        optional=dict(optional),
        variables=dict(r.kinds),
        warnings=r.warnings,
        shape=shape,
        tx_round_trips=tx_rts,
    )


# ------------------------------------------------------------------------------------------- wire trace
_RFQ = re.compile(r"^B\t\d+\tReadyForQuery\b")
_FRONT = re.compile(r"^F\t\d+\t(\w+)\t?(.*)$", re.S)
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


#: a client round trip that sent several statements (a pipeline): their SQL joined by this, for `sql_label`
FLIGHT_SEP = "\x1e"
#: a round trip that sent no statement: the Sync that ends a psycopg pipeline whose results were already fetched
PIPELINE_SYNC = "(pipeline sync)"
#: frontend messages after which the client waits for the backend
_WAIT_AFTER = frozenset({"Sync", "Flush", "Query"})


def trace_waits(lines: Sequence[str], prepared: dict[str, str]) -> list[list[str]]:
    """libpq protocol trace → the client's round trips: one per time it stopped to wait for the backend, i.e.
    per run of backend messages that answers a Sync, a Flush or a simple Query; for each, the statements (SQL
    text, one per Execute or Query) it sent since the previous one. `prepared` maps statement names to their
    SQL across calls.

    A Sync is answered by a ReadyForQuery, but in a psycopg pipeline a fetch before the end of the pipeline
    sends a Flush and waits for the results without one, and the Sync at the end is another wait: counting
    ReadyForQuery alone would miss the first. Backend messages read while the client is still sending (an
    executemany reading early results) are not a wait."""
    records: list[str] = []
    for line in lines:  # a query text with newlines continues on the next lines of the trace
        if line.startswith(("F\t", "B\t")) or not records:
            records.append(line)
        else:
            records[-1] += "\n" + line
    waits: list[list[str]] = []
    flight: list[str] = []
    current: str | None = None  # the statement the next Execute runs (extended protocol)
    last_front: str | None = None  # the frontend message sent last, None once the backend answered
    for line in records:
        if line.startswith("B\t"):
            if last_front in _WAIT_AFTER:
                waits.append(flight)
                flight = []
            last_front = None
            continue
        m = _FRONT.match(line)
        if not m:
            continue
        kind, rest = m.groups()
        last_front = kind
        quoted = _QUOTED.findall(rest)
        if kind == "Query":
            flight.append(quoted[0] if quoted else rest)
        elif kind == "Parse" and len(quoted) >= 2:
            if quoted[0]:
                prepared[quoted[0]] = quoted[1]
            current = quoted[1]
        elif kind == "Bind" and len(quoted) >= 2 and quoted[1]:
            current = prepared.get(quoted[1], f"prepared {quoted[1]}")
        elif kind == "Execute":
            flight.append(current or "?")
    return waits


def parse_trace(lines: Sequence[str], prepared: dict[str, str]) -> list[str]:
    """libpq protocol trace → one label per client round trip (`trace_waits`): the SQL it sent (several joined
    by FLIGHT_SEP, which `sql_label` splits), or PIPELINE_SYNC if it sent none."""
    return [FLIGHT_SEP.join(f) if f else PIPELINE_SYNC for f in trace_waits(lines, prepared)]


def ready_for_query(lines: Sequence[str]) -> int:
    """ReadyForQuery messages in a trace: one per Sync or simple query (the count before pipelines)."""
    return sum(1 for ln in lines if _RFQ.match(ln))


def sql_label(sql: str) -> str:
    """'INSERT INTO inbox_dedup (...) ...' → 'INSERT inbox_dedup'; keeps FOR UPDATE / ON CONFLICT visible. Several
    statements of one round trip (joined by FLIGHT_SEP) → their labels joined by ' + '."""
    if FLIGHT_SEP in sql:
        return " + ".join(sql_label(part) for part in sql.split(FLIGHT_SEP))
    s = " ".join(sql.split())
    if s in ("", ";"):
        return "pre-ping (empty query)"
    head = s.split(" ", 1)[0].upper()
    if head in ("BEGIN", "COMMIT", "ROLLBACK") or not s:
        return head or "?"
    if "pg_notify" in s:
        return "SELECT pg_notify"
    if head == "SELECT" and (m := re.match(r"SELECT (?:pg_catalog\.)?set_config\('([\w.]+)'", s, re.I)):
        return f"SELECT set_config {m.group(1)}"
    if head == "WITH":
        split = _split_with(s)
        if split is not None:
            ctes, main = split
            writes = [sql_label(c) for c in ctes if c.split(" ", 1)[0].upper() in ("INSERT", "UPDATE", "DELETE")]
            return (f"WITH ({', '.join(writes)}) " if writes else "WITH … ") + sql_label(main)
        m = re.search(r"\)\s*(INSERT INTO|UPDATE|DELETE FROM|SELECT .*? FROM)\s+(\w+)", s, re.I)
        return f"WITH … {m.group(1).split()[0].upper()} {m.group(2)}" if m else s[:40]
    m = {
        "INSERT": re.search(r"INSERT INTO (\w+)", s, re.I),
        "UPDATE": re.search(r"UPDATE (\w+)", s, re.I),
        "DELETE": re.search(r"DELETE FROM (\w+)", s, re.I),
        "SELECT": _top_level_from(s),
    }.get(head)
    label = f"{head} {m.group(1)}" if m else s[:40]
    if head == "SELECT" and re.search(r"FOR UPDATE", s, re.I):
        label += " FOR UPDATE"
    if head == "INSERT" and re.search(r"ON CONFLICT", s, re.I):
        label += " ON CONFLICT"
    return label


def _top_level_from(s: str) -> re.Match[str] | None:
    """The FROM of the statement itself, not of a subquery in its select list (else the first FROM)."""
    depth, quote = 0, ""
    level = []
    for c in s:
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        level.append(depth == 0 and not quote)
    for m in re.finditer(r" FROM (\w+)", s, re.I):
        if level[m.start()]:
            return m
    return re.search(r" FROM (\w+)", s, re.I)


def _split_with(s: str) -> tuple[list[str], str] | None:
    """'WITH a AS (...), b AS (...) main' → (['...', '...'], 'main'), or None if it does not parse."""
    m = re.match(r"WITH\s+(?:RECURSIVE\s+)?", s, re.I)
    if not m:
        return None
    i, ctes = m.end(), []
    while True:
        m = re.compile(r'(?:\w+|"[^"]*")\s*(?:\([^()]*\)\s*)?AS\s+(?:NOT\s+)?(?:MATERIALIZED\s+)?\(', re.I).match(s, i)
        if not m:
            return None
        depth, j, start = 1, m.end(), m.end()
        while j < len(s) and depth:
            c = s[j]
            if c in "'\"":  # a literal or a quoted name: skip it ('' and "" stay inside)
                k = s.find(c, j + 1)
                while k != -1 and k + 1 < len(s) and s[k + 1] == c:
                    k = s.find(c, k + 2)
                if k == -1:
                    return None
                j = k
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            j += 1
        if depth:
            return None
        ctes.append(s[start : j - 1].strip())
        rest = re.compile(r"\s*,\s*").match(s, j)
        if rest is None:
            return ctes, s[j:].strip()
        i = rest.end()


class WireCounter:
    """Counts what one engine sends: round trips (one per wait for the backend in libpq's protocol trace, see
    `trace_waits`; ReadyForQuery messages beside), Parse messages, pool checkouts. Attach before the engine
    opens a connection (or dispose it after attaching): only connections opened afterwards are traced."""

    def __init__(self, engine: Any, workdir: Path) -> None:
        import sqlalchemy as sa

        self.pgconns: list[Any] = []
        self._dbapi: weakref.WeakSet[Any] = weakref.WeakSet()
        self.workdir = workdir
        self._files: list[tuple[Any, Any]] = []
        self._file: Any = None
        self._checkouts = 0
        self.prepared: dict[str, str] = {}
        self._n = 0
        sa.event.listen(engine, "connect", self._connect)
        sa.event.listen(engine, "checkout", self._checkout)

    def watch_loop_pool(self, pool: Any) -> None:
        """Also trace and count the API's async loop pool (`AppContext.loop_pool`), before it opens."""
        if pool is not None:
            pool.watch(on_connect=lambda conn: self._connect(conn, None), on_checkout=self._checkout)

    def _connect(self, dbapi_conn: Any, _rec: Any) -> None:
        pgc = dbapi_conn.pgconn
        self.pgconns.append(pgc)
        self._dbapi.add(dbapi_conn)
        if self._file is not None:
            self._trace(pgc)

    def _checkout(self, *_: Any) -> None:
        self._checkouts += 1

    def _trace(self, pgc: Any) -> None:
        from psycopg import pq

        pgc.trace(self._file.fileno())
        pgc.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        self._files.append((pgc, self._file))

    def _known_prepared(self) -> None:
        """Statements psycopg prepared before the trace started (a Bind names them, the Parse is not in the
        trace): their SQL from each connection's prepared-statement cache, for names that mean the same SQL on
        every connection that has them."""
        seen: dict[str, set[str]] = {}
        for conn in list(self._dbapi):
            try:
                names = dict(conn._prepared._names)  # psycopg's PrepareManager: (query, types) -> name
            except Exception:  # noqa: BLE001 - a psycopg without it: labels stay "prepared <name>"
                return
            for (query, _types), name in names.items():
                seen.setdefault(name.decode(), set()).add(bytes(query).decode(errors="replace"))
        for name, queries in seen.items():
            if len(queries) == 1:
                self.prepared[name] = queries.pop()

    def one(self, call: Callable[[], Any]) -> tuple[list[str], int, int, int]:
        """Run `call` traced: (a label per round trip, Parse messages, checkouts, ReadyForQuery messages)."""
        self._known_prepared()
        self._n += 1
        path = self.workdir / f"wire-{id(self)}-{self._n}.txt"
        self._file = path.open("w")
        self._files = []
        for pgc in self.pgconns:
            self._trace(pgc)
        self._checkouts = 0
        try:
            call()
        finally:
            for pgc, _ in self._files:
                try:
                    pgc.untrace()
                except Exception:  # noqa: BLE001 - a connection closed meanwhile
                    pass
            self._file.close()
            self._file = None
        lines = path.read_text(errors="replace").splitlines()
        path.unlink(missing_ok=True)
        parses = sum(1 for ln in lines if re.match(r"^F\t\d+\tParse\b", ln))
        return (
            [sql_label(c) for c in parse_trace(lines, self.prepared)],
            parses,
            self._checkouts,
            ready_for_query(lines),
        )

    def measure(self, calls: Sequence[Callable[[], Any]]) -> dict[str, Any]:
        """Per operation over `calls`: round trips, Parse messages, checkouts, each statement kind, and the
        sequence of the first one."""
        labels: Counter[str] = Counter()
        rts = parses = checkouts = rfqs = 0
        first: list[str] = []
        for k, call in enumerate(calls):
            seq, p, c, rfq = self.one(call)
            rfqs += rfq
            if k == 0:
                first = seq
            labels.update(seq)
            rts += len(seq)
            parses += p
            checkouts += c
        n = max(1, len(calls))
        return {
            "operations": len(calls),
            "round_trips_per_op": round(rts / n, 2),
            "ready_for_query_per_op": round(rfqs / n, 2),
            "parse_messages_per_op": round(parses / n, 2),
            "checkouts_per_op": round(checkouts / n, 2),
            "statements": {k: round(v / n, 2) for k, v in labels.most_common()},
            "sequence": first,
        }


# ------------------------------------------------------------------------------------------- row work
def table_writes(pg: Postgres, db: str) -> dict[str, tuple[int, int, int]]:
    """(inserted, updated, deleted) tuples per table of `db` so far, from pg_stat_user_tables."""
    out = pg.psql(
        db,
        "SELECT pg_stat_clear_snapshot(); SELECT relname, n_tup_ins, n_tup_upd, n_tup_del "
        "FROM pg_stat_user_tables ORDER BY relname",
    )
    res = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 4 and parts[1].isdigit():
            res[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3]))
    return res


def settled_writes(
    pg: Postgres, db: str, changed_from: dict[str, tuple[int, int, int]] | None = None, timeout_s: float = 6.0
) -> dict[str, tuple[int, int, int]]:
    """Table counters once they stop moving (a backend flushes its counts when it exits, a moment after the
    client closed the connection) and, with `changed_from`, once they differ from it."""
    deadline = time.monotonic() + timeout_s
    last = table_writes(pg, db)
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = table_writes(pg, db)
        if now == last and (changed_from is None or now != changed_from):
            return now
        last = now
    return last


def committed_segments(sequence: Sequence[str]) -> list[list[str]]:
    """The BEGIN … COMMIT stretches of a round-trip sequence (what one transaction costs on the wire). A round
    trip's label may name several pipelined statements ('BEGIN + SELECT tenants'): it counts as the start if
    its first is BEGIN, as the end if its last is COMMIT or ROLLBACK."""
    out: list[list[str]] = []
    cur: list[str] | None = None
    for label in sequence:
        parts = label.split(" + ")
        if parts[0] == "BEGIN":
            cur = []
        if cur is None:
            continue
        cur.append(label)
        if parts[-1] in ("COMMIT", "ROLLBACK"):
            if parts[-1] == "COMMIT":
                out.append(cur)
            cur = None
    return out


def writes_per_op(
    before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]], ops: int
) -> dict[str, list[float]]:
    out = {}
    for t, vals in after.items():
        d = [v - w for v, w in zip(vals, before.get(t, (0, 0, 0)), strict=False)]
        if any(d):
            out[t] = [round(x / ops, 3) for x in d]
    return out


def run_script_n(pg: Postgres, db: str, script: Path, transactions: int, clients: int, defines: dict[str, Any]) -> str:
    """pgbench -t (a fixed count per client), for checking a script does what the product does."""
    cmd = [
        need_tool("pgbench"),
        "-n",
        "-M",
        "prepared",
        "-t",
        str(transactions),
        "-c",
        str(clients),
        "-j",
        "1",
        "-f",
        str(script),
    ]
    for k, v in defines.items():
        cmd += ["-D", f"{k}={v}"]
    res = subprocess.run(cmd + [db], env=pg.env(), capture_output=True, text=True)
    failed = re.search(r"number of failed transactions: (\d+)", res.stdout)
    if res.returncode != 0 or (failed and int(failed.group(1))):
        raise BenchError(
            f"the own-transaction script failed under pgbench ({res.returncode}):\n"
            f"{res.stderr.strip()[-1500:]}\n{res.stdout.strip()[-500:]}"
        )
    return res.stdout


def compare_writes(product: dict[str, list[float]], replay: dict[str, list[float]]) -> dict[str, Any]:
    """Same inserts, updates and deletes per table per operation? (HOT or not is not compared.)"""
    tables = sorted(set(product) | set(replay))
    rows = {t: {"product": product.get(t, [0, 0, 0]), "replay": replay.get(t, [0, 0, 0])} for t in tables}
    ok = all(abs(a - b) < 1e-6 for t in tables for a, b in zip(rows[t]["product"], rows[t]["replay"], strict=False))
    return {"ok": ok, "per_table_ins_upd_del_per_op": rows}
