"""Failure and edge paths of the `fetch.requested` consumer (services/output_fetch.py) against the sim provider.

Each test drives one generation through the real pipeline (embedded SQLite, in-process Pump) up to
OUTPUT_FETCHING while holding the fetch.requested row back, then delivers that row itself, so it can shape the
world first (expire the URL, break the CDN, plant an object under the raw key) and read the consumer's answer.
Both clocks are manual: the engine's FakeClock and the sim's SimClock move only when a test advances them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import (
    alerts,
    assets,
    credit_ledger,
    generation_tasks,
    inbox_dedup,
    outbox_events,
    task_attempts,
    task_state_events,
)
from aivedio_engine.domain.status import OutboxStatus
from aivedio_engine.fetch import _transport
from aivedio_engine.fetch.fetcher import Fetcher
from aivedio_engine.providers.base import NotFound
from aivedio_engine.providers.sim.app import sample_mp4
from aivedio_engine.services.consume import Envelope
from aivedio_engine.services.output_fetch import OutputFetchService
from aivedio_engine.storage import keys
from tests.support.app import tenant_with_key
from tests.support.flow import Driver, sim_context
from tests.support.pump import Pump
from tests.support.sim import SimHandle

FETCH = "fetch.requested"
MEDIA = "media.process.requested"
STATUS_CHANGED = "task.status.changed"


# --- helpers (shared with test_media_pipeline.py) ------------------------------------------------------------


class HoldingPump(Pump):
    """A Pump that leaves rows of the `hold` event types PENDING, for the test to deliver itself."""

    def __init__(self, ctx: AppContext, hold: Iterable[str]) -> None:
        super().__init__(ctx)
        self.hold = frozenset(hold)

    def run(self, max_events: int = 10_000) -> int:
        handlers = self._handlers()
        delivered = 0
        while delivered < max_events:
            rows = [r for r in pending(self.ctx) if r.event_type not in self.hold]
            if not rows:
                return delivered
            for row in rows:
                handler = handlers.get(row.event_type)
                if handler is None:
                    self.parked.append({"event_type": row.event_type, **row.payload})
                else:
                    handler(envelope(row))
                    self.seen[row.event_type] += 1
                mark_published(self.ctx, row.id)
                delivered += 1
        return delivered


def pending(ctx: AppContext, event_type: str | None = None, *, due_only: bool = True) -> list[Any]:
    o = outbox_events.c
    stmt = sa.select(outbox_events).where(o.status == OutboxStatus.PENDING.value)
    if due_only:
        stmt = stmt.where(o.available_at <= ctx.clock.now())
    if event_type is not None:
        stmt = stmt.where(o.event_type == event_type)
    with ctx.engine.connect() as conn:
        return list(conn.execute(stmt.order_by(o.id)).all())


def outbox_of(ctx: AppContext, event_type: str, task_id: uuid.UUID) -> list[Any]:
    o = outbox_events.c
    with ctx.engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(outbox_events)
                .where(o.event_type == event_type, o.aggregate_id == task_id)
                .order_by(o.created_at, o.id)
            ).all()
        )


def envelope(row: Any) -> Envelope:
    return Envelope(
        event_id=row.id,
        event_type=row.event_type,
        schema_version=row.schema_version,
        aggregate_id=row.aggregate_id,
        aggregate_version=row.aggregate_version,
        tenant_id=row.tenant_id,
        trace_id=row.trace_id,
        causation_id=row.causation_id,
        occurred_at=row.created_at,
        payload=row.payload,
    )


def mark_published(ctx: AppContext, event_id: uuid.UUID) -> None:
    with ctx.engine.begin() as conn:
        conn.execute(
            outbox_events.update()
            .where(outbox_events.c.id == event_id)
            .values(status=OutboxStatus.PUBLISHED.value, published_at=ctx.clock.now())
        )


def deliver_one(ctx: AppContext, event_type: str, handle: Callable[[Envelope], str]) -> str:
    """Hand the single due row of `event_type` to `handle` (the service itself, so its answer is visible)."""
    rows = pending(ctx, event_type)
    assert len(rows) == 1, f"expected one due {event_type} row, found {len(rows)}"
    result = handle(envelope(rows[0]))
    mark_published(ctx, rows[0].id)
    return result


def task_row(ctx: AppContext, task_id: uuid.UUID) -> Any:
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(generation_tasks).where(generation_tasks.c.id == task_id)).one()


def attempt_row(ctx: AppContext, task_id: uuid.UUID) -> Any:
    with ctx.engine.connect() as conn:
        return conn.execute(sa.select(task_attempts).where(task_attempts.c.task_id == task_id)).one()


def history(ctx: AppContext, task_id: uuid.UUID) -> list[tuple[str | None, str | None]]:
    e = task_state_events.c
    with ctx.engine.connect() as conn:
        return [
            (r.from_status, r.to_status)
            for r in conn.execute(
                sa.select(e.from_status, e.to_status)
                .where(e.task_id == task_id, e.outcome == "applied")
                .order_by(e.task_version)
            )
        ]


def ledger(ctx: AppContext, task_id: uuid.UUID) -> list[tuple[str, Decimal]]:
    c = credit_ledger.c
    with ctx.engine.connect() as conn:
        return [
            (r.entry_type, Decimal(r.amount))
            for r in conn.execute(
                sa.select(c.entry_type, c.amount).where(c.task_id == task_id).order_by(c.created_at, c.id)
            )
        ]


def assert_settled(ctx: AppContext, task_id: uuid.UUID) -> None:
    """The reservation was closed by exactly one SETTLE: RESERVE + SETTLE = −actual cost, nothing left reserved."""
    task = task_row(ctx, task_id)
    entries = ledger(ctx, task_id)
    assert [t for t, _ in entries] == ["RESERVE", "SETTLE"], entries
    assert entries[0][1] + entries[1][1] == -Decimal(task.actual_cost)
    assert Decimal(task.actual_cost) == Decimal(task.estimated_cost) > 0  # the provider delivered: cost is real
    assert Decimal(task.reserved_amount) == 0


def assert_absorbed(ctx: AppContext, task_id: uuid.UUID) -> None:
    """Nothing delivered, not by the tenant's doing: the whole reservation released, nothing charged, and the
    vendor's bill (the sim bills the clip) booked once as platform cost (a 0-credit ADJUSTMENT) with an alert."""
    task = task_row(ctx, task_id)
    estimate = Decimal(task.estimated_cost)
    assert ledger(ctx, task_id) == [("RESERVE", -estimate), ("RELEASE", estimate), ("ADJUSTMENT", Decimal(0))]
    assert Decimal(task.actual_cost) == 0 and Decimal(task.reserved_amount) == 0
    c = credit_ledger.c
    with ctx.engine.connect() as conn:
        (vendor_amount,) = conn.execute(
            sa.select(c.vendor_amount).where(c.task_id == task_id, c.entry_type == "ADJUSTMENT")
        ).scalars()
    assert Decimal(vendor_amount) == estimate > 0
    assert [a.subject_id for a in alerts_of(ctx, "platform_cost")] == [str(task_id)]


def assert_only_reserved(ctx: AppContext, task_id: uuid.UUID) -> None:
    task = task_row(ctx, task_id)
    assert [t for t, _ in ledger(ctx, task_id)] == ["RESERVE"]
    assert Decimal(task.reserved_amount) == Decimal(task.estimated_cost) > 0


def alerts_of(ctx: AppContext, rule: str | None = None) -> list[Any]:
    stmt = sa.select(alerts)
    if rule is not None:
        stmt = stmt.where(alerts.c.rule == rule)
    with ctx.engine.connect() as conn:
        return list(conn.execute(stmt).all())


def assets_of(ctx: AppContext, task_id: uuid.UUID, kind: str | None = None) -> list[Any]:
    stmt = sa.select(assets).where(assets.c.task_id == task_id)
    if kind is not None:
        stmt = stmt.where(assets.c.kind == kind)
    with ctx.engine.connect() as conn:
        return list(conn.execute(stmt.order_by(assets.c.created_at)).all())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_object(ctx: AppContext, key: str) -> bytes:
    with ctx.storage.open_read(key) as f:
        return f.read()


@dataclass
class Staged:
    ctx: AppContext
    sim: SimHandle
    task_id: uuid.UUID
    tenant_id: uuid.UUID

    @property
    def attempt(self) -> Any:
        return attempt_row(self.ctx, self.task_id)

    @property
    def status(self) -> str:
        return str(task_row(self.ctx, self.task_id).status)

    def raw_key(self, index: int = 0) -> str:
        return keys.raw_output_key(self.tenant_id, self.task_id, self.attempt.id, index)

    def fetch(self) -> str:
        return deliver_one(self.ctx, FETCH, self.ctx.output_fetch.handle)

    def media(self) -> str:
        return deliver_one(self.ctx, MEDIA, self.ctx.media.handle)

    def finish(self) -> int:
        """Deliver everything still pending (fetch, media, notifications) through the registered consumers."""
        return Pump(self.ctx).run()


def stage(
    tmp_path: Path, sim: SimHandle, *, hold: Iterable[str] = (FETCH,), prompt: str = "a paper boat", **overrides: Any
) -> Staged:
    """One task driven through submit and polling until the sim job succeeded: the task is OUTPUT_FETCHING
    (or further, for what `hold` does not hold back) and the held rows are PENDING."""
    ctx = sim_context(tmp_path, sim, **overrides)
    who = tenant_with_key(ctx, "acme", credits=1000)
    task = ctx.generations.create(who.tenant_id, "k1", {"prompt": prompt, "model": "sim-v1", "duration_s": 2}).task
    drv = Driver(ctx, sim, HoldingPump(ctx, hold))
    drv.run_until(lambda: len(pending(ctx, next(iter(hold)))) == 1, max_rounds=30)
    return Staged(ctx, sim, task.id, who.tenant_id)


def use_fetcher(ctx: AppContext, *, resolver: Any = None, rng: random.Random | None = None) -> None:
    """Replace the context's OutputFetchService by one with a seeded rng and/or a spy resolver."""
    fetcher = Fetcher(ctx.settings.fetch, resolver=resolver, clock=ctx.clock)
    ctx.output_fetch = OutputFetchService(
        ctx.engine,
        ctx.clock,
        ctx.settings,
        ctx.providers,  # type: ignore[misc]
        ctx.storage,
        fetcher,
        rng=rng or random.Random(7),
    )


def set_fetch_payload(ctx: AppContext, **changes: Any) -> dict[str, Any]:
    """Rewrite the pending fetch.requested row's payload (what a reducer would have written from an observation)."""
    (row,) = pending(ctx, FETCH)
    payload = {**row.payload, **changes}
    with ctx.engine.begin() as conn:
        conn.execute(outbox_events.update().where(outbox_events.c.id == row.id).values(payload=payload))
    return payload


# --- tests ---------------------------------------------------------------------------------------------------


def test_expired_url_is_refreshed_through_the_provider_once_and_stored(tmp_path: Path, sim_factory: Any) -> None:
    sim = sim_factory(output_url_ttl_s=60)
    s = stage(tmp_path, sim)
    assert s.status == "OUTPUT_FETCHING"
    (row,) = pending(s.ctx, FETCH)
    assert row.payload["outputs"][0]["url"].startswith(sim.base_url + "/outputs/")
    sim.advance(120)  # the signed URL in the observation has expired on the vendor's clock
    queries, outputs = sim.state.calls["query"], sim.state.calls["output"]

    assert s.fetch() == "stored 1"

    assert sim.state.calls["query"] == queries + 1  # asked for a fresh URL exactly once
    assert sim.state.calls["output"] == outputs + 2  # the expired URL (403), then the fresh one
    assert s.status == "POST_PROCESSING"
    (raw,) = assets_of(s.ctx, s.task_id, "RAW_OUTPUT")
    assert raw.object_key == s.raw_key() and raw.status == "PROCESSING"
    assert raw.checksum_value == sha256(sample_mp4()) and raw.size_bytes == len(sample_mp4())
    assert read_object(s.ctx, raw.object_key) == sample_mp4()
    assert history(s.ctx, s.task_id)[-1] == ("OUTPUT_FETCHING", "POST_PROCESSING")
    (media,) = outbox_of(s.ctx, MEDIA, s.task_id)
    assert media.payload == {"task_id": str(s.task_id), "asset_id": str(raw.id)}
    assert task_row(s.ctx, s.task_id).output_asset_id == raw.id
    assert alerts_of(s.ctx) == []
    s.finish()
    assert s.status == "SUCCEEDED"
    assert_settled(s.ctx, s.task_id)
    s.ctx.close()


def test_all_expired_outputs_of_a_job_use_the_one_fresh_answer(
    tmp_path: Path, sim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job with two outputs whose URLs both expired: the single refresh of this try serves both of them."""
    sim = sim_factory(output_url_ttl_s=60)
    s = stage(tmp_path, sim)
    provider = s.ctx.providers["sim"]
    real_query = provider.query

    def two_outputs(job_id: str) -> Any:  # a vendor that returns several files per job (e.g. variants)
        obs = real_query(job_id)
        return dataclasses.replace(obs, outputs=(obs.outputs[0], dataclasses.replace(obs.outputs[0], index=1)))

    monkeypatch.setattr(provider, "query", two_outputs)
    (row,) = pending(s.ctx, FETCH)
    out = row.payload["outputs"][0]
    set_fetch_payload(s.ctx, outputs=[out, {**out, "index": 1}])
    sim.advance(120)  # both URLs of the observation have expired
    queries = sim.state.calls["query"]

    assert s.fetch() == "stored 2"

    assert sim.state.calls["query"] == queries + 1
    assert s.status == "POST_PROCESSING"
    raws = assets_of(s.ctx, s.task_id, "RAW_OUTPUT")
    assert sorted(r.output_index for r in raws) == [0, 1]
    assert {r.object_key for r in raws} == {s.raw_key(0), s.raw_key(1)}
    assert all(r.checksum_value == sha256(sample_mp4()) for r in raws)
    assert pending(s.ctx, FETCH, due_only=False) == [] and alerts_of(s.ctx) == []
    s.ctx.close()


def test_success_observed_without_urls_asks_the_provider_for_them(tmp_path: Path, sim: SimHandle) -> None:
    s = stage(tmp_path, sim)
    set_fetch_payload(s.ctx, outputs=[])
    queries = sim.state.calls["query"]

    assert s.fetch() == "stored 1"

    assert sim.state.calls["query"] == queries + 1
    (raw,) = assets_of(s.ctx, s.task_id, "RAW_OUTPUT")
    assert raw.object_key == s.raw_key() and raw.checksum_value == sha256(sample_mp4())
    assert s.status == "POST_PROCESSING"
    s.ctx.close()


def test_expired_url_without_a_fresh_one_from_the_provider_retries_later(
    tmp_path: Path, sim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = sim_factory(output_url_ttl_s=60)
    s = stage(tmp_path, sim)
    use_fetcher(s.ctx)
    monkeypatch.setattr(s.ctx.providers["sim"], "query", lambda job_id: NotFound())
    sim.advance(120)

    assert s.fetch() == "failed: refresh_failed"

    assert s.status == "OUTPUT_FETCHING"
    (retry,) = pending(s.ctx, FETCH, due_only=False)
    assert retry.payload["try"] == 2 and retry.available_at > s.ctx.clock.now()
    task = task_row(s.ctx, s.task_id)
    assert (task.last_error_class, task.last_error_code) == ("output_url_expired", "refresh_failed")
    assert assets_of(s.ctx, s.task_id) == [] and alerts_of(s.ctx) == []
    assert_only_reserved(s.ctx, s.task_id)
    s.ctx.close()


def test_url_still_refused_after_refresh_retries_later_with_one_query_per_try(
    tmp_path: Path, sim_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = sim_factory()
    s = stage(tmp_path, sim, retry={"output_fetch": {"max_attempts": 2, "base_delay_s": 5, "max_delay_s": 5}})
    use_fetcher(s.ctx)
    monkeypatch.setattr(sim.state, "output_allowed", lambda *a: 403)  # the CDN refuses even fresh URLs
    queries = sim.state.calls["query"]

    assert s.fetch().startswith("failed: http_403")
    assert sim.state.calls["query"] == queries + 1
    assert s.status == "OUTPUT_FETCHING"
    (retry,) = pending(s.ctx, FETCH, due_only=False)
    assert retry.payload["try"] == 2 and retry.available_at > s.ctx.clock.now()
    assert task_row(s.ctx, s.task_id).last_error_class == "output_url_expired"

    s.ctx.clock.advance(5)  # type: ignore[attr-defined]
    assert s.fetch().startswith("failed: http_403")
    assert sim.state.calls["query"] == queries + 2  # each try may ask for a fresh URL once
    assert s.status == "FAILED_FINAL"
    assert pending(s.ctx, FETCH, due_only=False) == []
    (alert,) = alerts_of(s.ctx, "output_fetch_failed")
    assert "retry budget spent" in alert.message
    assert_absorbed(s.ctx, s.task_id)
    s.ctx.close()


def test_redirect_is_followed_and_the_output_stored(tmp_path: Path, sim_factory: Any) -> None:
    sim = sim_factory(faults="redirect=1")
    s = stage(tmp_path, sim)
    outputs = sim.state.calls["output"]

    assert s.fetch() == "stored 1"

    assert sim.state.calls["output"] == outputs + 2  # /outputs/{job}.mp4 → 302 → /outputs/r/{job}.mp4
    (raw,) = assets_of(s.ctx, s.task_id, "RAW_OUTPUT")
    assert raw.checksum_value == sha256(sample_mp4())
    assert s.status == "POST_PROCESSING"
    s.finish()
    assert s.status == "SUCCEEDED"
    assert_settled(s.ctx, s.task_id)
    s.ctx.close()


def test_redirects_beyond_the_limit_are_a_policy_refusal(tmp_path: Path, sim_factory: Any) -> None:
    sim = sim_factory(faults="redirect=1")
    s = stage(tmp_path, sim, fetch={"max_redirects": 0})
    queries = sim.state.calls["query"]

    assert s.fetch() == "failed: too_many_redirects"

    assert sim.state.calls["query"] == queries  # no refresh: a fresh URL would redirect just the same
    assert s.status == "FAILED_FINAL"
    assert assets_of(s.ctx, s.task_id) == []
    assert pending(s.ctx, FETCH, due_only=False) == []
    (alert,) = alerts_of(s.ctx, "output_fetch_failed")
    assert "too_many_redirects" in alert.message
    assert_absorbed(s.ctx, s.task_id)
    s.ctx.close()


class SpyResolver:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def resolve(self, host: str, port: int) -> list[Any]:
        self.calls.append(host)
        raise AssertionError(f"the fetcher resolved {host}")


@pytest.mark.parametrize(
    "url",
    [
        "https://example.invalid/out.mp4?sig=s3cr3t",
        "https://10.0.0.1/out.mp4",
        "http://127.0.0.1:6379/",  # the sim host, another port
        "http://169.254.169.254/latest/meta-data",
        "file:///etc/passwd",
    ],
)
def test_output_url_refused_by_the_fetch_policy_fails_without_any_network_call(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    s = stage(tmp_path, sim)
    resolver = SpyResolver()
    use_fetcher(s.ctx, resolver=resolver)
    connects: list[Any] = []
    monkeypatch.setattr(_transport, "open_pinned", lambda *a, **k: connects.append(a) or pytest.fail("connected"))
    set_fetch_payload(s.ctx, outputs=[{"url": url, "index": 0, "expires_at": None}])
    queries, outputs = sim.state.calls["query"], sim.state.calls["output"]

    result = s.fetch()

    assert result in ("failed: blocked_host", "failed: blocked_scheme"), result
    assert resolver.calls == [] and connects == []
    assert (sim.state.calls["query"], sim.state.calls["output"]) == (queries, outputs)  # not even a refresh
    task = task_row(s.ctx, s.task_id)
    assert task.status == "FAILED_FINAL" and task.last_error_code == result.removeprefix("failed: ")
    assert history(s.ctx, s.task_id)[-1] == ("OUTPUT_FETCHING", "FAILED_FINAL")
    assert assets_of(s.ctx, s.task_id) == []
    assert pending(s.ctx, FETCH, due_only=False) == []  # a policy refusal is never retried
    assert outbox_of(s.ctx, MEDIA, s.task_id) == []
    assert outbox_of(s.ctx, STATUS_CHANGED, s.task_id)[-1].payload["status"] == "FAILED_FINAL"
    assert sorted(a.rule for a in alerts_of(s.ctx)) == ["output_fetch_failed", "platform_cost"]
    (alert,) = alerts_of(s.ctx, "output_fetch_failed")
    assert alert.subject_id == str(s.task_id)
    assert "refused by fetch policy" in alert.message
    assert "s3cr3t" not in alert.message  # signed query strings never reach alerts
    assert_absorbed(s.ctx, s.task_id)
    s.ctx.close()


def test_transient_cdn_failure_retries_through_a_delayed_row_then_recovers(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stage(tmp_path, sim, retry={"output_fetch": {"max_attempts": 3, "base_delay_s": 10, "max_delay_s": 10}})
    use_fetcher(s.ctx)
    broken = {"on": True}
    real = sim.state.output_allowed
    monkeypatch.setattr(sim.state, "output_allowed", lambda *a: 503 if broken["on"] else real(*a))
    queries = sim.state.calls["query"]
    started = s.ctx.clock.now()

    assert s.fetch() == "failed: http_503"

    assert sim.state.calls["query"] == queries  # a 5xx is not an expired URL: no refresh
    assert s.status == "OUTPUT_FETCHING"
    (retry,) = pending(s.ctx, FETCH, due_only=False)
    assert retry.payload["try"] == 2
    assert started < retry.available_at <= started + timedelta(seconds=10)
    assert datetime.fromisoformat(retry.payload["first_failure_at"]) == started
    assert pending(s.ctx, FETCH) == []  # not due yet: the Pump would not deliver it now
    task = task_row(s.ctx, s.task_id)
    assert (task.last_error_class, task.last_error_code) == ("output_download_transient", "http_503")
    assert assets_of(s.ctx, s.task_id) == [] and s.ctx.storage.head(s.raw_key()) is None
    assert_only_reserved(s.ctx, s.task_id)

    broken["on"] = False
    s.ctx.clock.advance((retry.available_at - started).total_seconds())  # type: ignore[attr-defined]
    assert s.fetch() == "stored 1"
    assert s.status == "POST_PROCESSING"
    assert len(assets_of(s.ctx, s.task_id, "RAW_OUTPUT")) == 1
    assert alerts_of(s.ctx) == []
    s.ctx.close()


def test_a_store_outage_holds_the_fetch_without_spending_a_try_and_raises_one_alert(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """: our own store failing is no fault of the output. The step raises (the broker retries it,
    then the sweeper re-drives it) with nothing spent, and the on-call engineer gets one alert for the store."""
    s = stage(tmp_path, sim)
    (row,) = pending(s.ctx, FETCH)
    store_type = type(s.ctx.storage)
    real = store_type.put_stream

    def store_down(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("store unreachable")

    monkeypatch.setattr(store_type, "put_stream", store_down)
    for _ in range(4):  # the broker's and the sweeper's deliveries, past the fetch budget (3)
        with pytest.raises(ConnectionError, match="store unreachable"):
            s.ctx.output_fetch.handle(envelope(row))

    assert s.status == "OUTPUT_FETCHING"
    assert [r.id for r in pending(s.ctx, FETCH, due_only=False)] == [row.id]  # no retry row: no try spent
    task = task_row(s.ctx, s.task_id)
    assert task.last_error_class is None
    assert assets_of(s.ctx, s.task_id) == []
    (alert,) = alerts_of(s.ctx)  # one per store, however many deliveries failed
    assert (alert.rule, alert.severity, alert.subject_type) == ("storage_unavailable", "critical", "storage")
    assert alert.details == {"step": "fetch", "task_id": str(s.task_id), "error": "ConnectionError: store unreachable"}
    assert_only_reserved(s.ctx, s.task_id)

    monkeypatch.setattr(store_type, "put_stream", real)  # the store is back
    assert s.ctx.output_fetch.handle(envelope(row)) == "stored 1"
    assert s.status == "POST_PROCESSING"
    assert len(assets_of(s.ctx, s.task_id, "RAW_OUTPUT")) == 1
    s.ctx.close()


def test_transient_failure_past_the_budget_fails_the_task_and_releases_the_credits(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = stage(tmp_path, sim, retry={"output_fetch": {"max_attempts": 3, "base_delay_s": 2, "max_delay_s": 2}})
    use_fetcher(s.ctx)
    monkeypatch.setattr(sim.state, "output_allowed", lambda *a: 500)
    first = s.ctx.clock.now()
    results = []
    for expected_try in (2, 3):
        results.append(s.fetch())
        assert s.status == "OUTPUT_FETCHING"
        (retry,) = pending(s.ctx, FETCH, due_only=False)
        assert retry.payload["try"] == expected_try
        assert retry.available_at > s.ctx.clock.now()
        assert datetime.fromisoformat(retry.payload["first_failure_at"]) == first  # kept across tries
        s.ctx.clock.advance(2)  # type: ignore[attr-defined]
    results.append(s.fetch())

    assert results == ["failed: http_500"] * 3
    assert s.status == "FAILED_FINAL"
    assert pending(s.ctx, FETCH, due_only=False) == []
    assert [r.payload.get("try", 1) for r in outbox_of(s.ctx, FETCH, s.task_id)] == [1, 2, 3]
    assert history(s.ctx, s.task_id)[-1] == ("OUTPUT_FETCHING", "FAILED_FINAL")
    assert [to for _, to in history(s.ctx, s.task_id)].count("OUTPUT_FETCHING") == 1  # retries moved nothing
    (alert,) = alerts_of(s.ctx, "output_fetch_failed")
    assert "3/3" in alert.message and alert.subject_id == str(s.task_id)
    assert assets_of(s.ctx, s.task_id) == []
    assert_absorbed(s.ctx, s.task_id)
    assert outbox_of(s.ctx, STATUS_CHANGED, s.task_id)[-1].payload["status"] == "FAILED_FINAL"
    s.ctx.close()


def test_duplicate_delivery_of_one_envelope_stores_once_and_moves_once(tmp_path: Path, sim: SimHandle) -> None:
    s = stage(tmp_path, sim)
    (row,) = pending(s.ctx, FETCH)
    env = envelope(row)
    outputs = sim.state.calls["output"]

    first = s.ctx.output_fetch.handle(env)
    second = s.ctx.output_fetch.handle(env)

    assert (first, second) == ("stored 1", "skipped: task is POST_PROCESSING")
    assert sim.state.calls["output"] == outputs + 1  # the duplicate did not download again
    assert len(assets_of(s.ctx, s.task_id, "RAW_OUTPUT")) == 1
    assert history(s.ctx, s.task_id).count(("OUTPUT_FETCHING", "POST_PROCESSING")) == 1
    assert len(outbox_of(s.ctx, MEDIA, s.task_id)) == 1
    with s.ctx.engine.connect() as conn:
        inbox = conn.execute(
            sa.select(sa.func.count())
            .select_from(inbox_dedup)
            .where(inbox_dedup.c.consumer_group == "output-fetch", inbox_dedup.c.event_id == env.event_id)
        ).scalar_one()
    assert inbox == 1
    s.ctx.close()


def test_duplicate_racing_past_the_status_check_commits_nothing_twice(tmp_path: Path, sim: SimHandle) -> None:
    """Two deliveries both download before either commits (concurrent workers): the inbox row dedups the
    second commit, and the deterministic key means the same object was written, not a second one."""
    s = stage(tmp_path, sim)
    (row,) = pending(s.ctx, FETCH)
    env = envelope(row)
    svc = s.ctx.output_fetch
    inner: list[str] = []
    raced: list[bool] = []
    real_store = svc._store_output

    def store_then_duplicate(*args: Any) -> Any:
        result = real_store(*args)
        if not raced:  # while the first delivery sits between download and commit, the duplicate runs fully
            raced.append(True)
            inner.append(svc.handle(env))
        return result

    svc._store_output = store_then_duplicate  # type: ignore[method-assign]
    outer = svc.handle(env)

    assert inner == ["stored 1"] and outer == "stored 1"
    assert len(assets_of(s.ctx, s.task_id, "RAW_OUTPUT")) == 1
    assert history(s.ctx, s.task_id).count(("OUTPUT_FETCHING", "POST_PROCESSING")) == 1
    assert len(outbox_of(s.ctx, MEDIA, s.task_id)) == 1
    assert alerts_of(s.ctx) == []  # the second download found the same bytes under the key
    s.ctx.close()


def test_existing_object_with_the_same_bytes_is_reused_without_alert(tmp_path: Path, sim: SimHandle) -> None:
    s = stage(tmp_path, sim)
    key = s.raw_key()
    # a crash after the upload, before the commit: the object is there, no asset row yet
    s.ctx.storage.put_stream(key, [sample_mp4()], "video/mp4", 1 << 30)
    before = s.ctx.storage.head(key)
    outputs = sim.state.calls["output"]

    assert s.fetch() == "stored 1"

    assert sim.state.calls["output"] == outputs + 1  # downloaded to compare
    (raw,) = assets_of(s.ctx, s.task_id, "RAW_OUTPUT")
    assert raw.object_key == key and raw.checksum_value == sha256(sample_mp4())
    assert s.ctx.storage.head(key) == before
    assert s.ctx.storage.head(f"{key.removesuffix('.mp4')}-{sha256(sample_mp4())[:16]}.mp4") is None
    assert alerts_of(s.ctx) == []
    assert s.status == "POST_PROCESSING"
    s.ctx.close()


def test_existing_object_with_other_bytes_is_kept_and_the_new_one_stored_beside_it(
    tmp_path: Path, sim: SimHandle
) -> None:
    s = stage(tmp_path, sim)
    key = s.raw_key()
    planted = b"\x00\x00\x00\x18ftypmp42 not the provider's bytes"
    s.ctx.storage.put_stream(key, [planted], "video/mp4", 1 << 30)

    assert s.fetch() == "stored 1"

    beside = f"{key.removesuffix('.mp4')}-{sha256(sample_mp4())[:16]}.mp4"
    assert read_object(s.ctx, key) == planted  # never overwritten
    assert read_object(s.ctx, beside) == sample_mp4()
    (raw,) = assets_of(s.ctx, s.task_id, "RAW_OUTPUT")
    assert raw.object_key == beside and raw.checksum_value == sha256(sample_mp4())
    assert raw.size_bytes == len(sample_mp4())
    (alert,) = alerts_of(s.ctx)
    assert alert.rule == "output_checksum_mismatch" and alert.severity == "warning"
    assert alert.dedup_key == key and alert.subject_id == str(s.task_id)
    assert key in alert.message and beside in alert.message
    assert s.status == "POST_PROCESSING"
    s.finish()  # media processes what was fetched now, not the planted object
    assert s.status == "SUCCEEDED"
    assert_settled(s.ctx, s.task_id)
    s.ctx.close()


def test_late_delivery_after_the_task_left_output_fetching_does_nothing(tmp_path: Path, sim: SimHandle) -> None:
    s = stage(tmp_path, sim)
    (row,) = pending(s.ctx, FETCH)
    with s.ctx.engine.begin() as conn:  # e.g. an operator failed it meanwhile
        conn.execute(generation_tasks.update().where(generation_tasks.c.id == s.task_id).values(status="FAILED_FINAL"))
    outputs = sim.state.calls["output"]
    assert s.ctx.output_fetch.handle(envelope(row)) == "skipped: task is FAILED_FINAL"
    assert sim.state.calls["output"] == outputs
    assert assets_of(s.ctx, s.task_id) == [] and alerts_of(s.ctx) == []
    s.ctx.close()
