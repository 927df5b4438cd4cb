"""Failure and edge paths of the `media.process.requested` consumer (services/media.py).

Each test drives one generation against the sim provider (embedded SQLite, in-process Pump) through the real
output fetch and holds the media.process.requested row back; the test then shapes the world (tamper with the
stored object, tighten the gate, break a derivative) and delivers the row itself to read the consumer's answer.
The sim serves a real 1 s, 160x90 H.264 clip without audio, so ffprobe and ffmpeg run for real.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from aivedio_engine.db.tables import credit_ledger, review_items
from aivedio_engine.domain.retry import Step
from aivedio_engine.domain.status import DerivativeProfile
from aivedio_engine.media import derive
from aivedio_engine.media.probe import ProbeUnavailable
from aivedio_engine.providers.sim import app as sim_app
from aivedio_engine.services import media as media_module
from aivedio_engine.services.media import Outcome
from aivedio_engine.storage import keys
from aivedio_engine.storage.base import ObjectNotFound
from tests.flow.test_output_fetch import (
    MEDIA,
    STATUS_CHANGED,
    Staged,
    alerts_of,
    assert_absorbed,
    assert_only_reserved,
    assert_settled,
    assets_of,
    envelope,
    history,
    ledger,
    outbox_of,
    pending,
    read_object,
    sha256,
    stage,
    task_row,
)
from tests.support.sim import SimHandle

REQUIRED = {"PROXY", "HLS", "THUMBNAIL"}  # kinds of the default required profiles (proxy_mp4, hls, thumbnail)


_REAL_BUILD = derive.build_derivatives


def staged(tmp_path: Path, sim: SimHandle, **overrides: Any) -> Staged:
    """A task in POST_PROCESSING whose media.process.requested row is PENDING (fetch already done)."""
    s = stage(tmp_path, sim, hold=(MEDIA,), **overrides)
    assert s.status == "POST_PROCESSING"
    return s


def raw_of(s: Staged) -> Any:
    (raw,) = assets_of(s.ctx, s.task_id, "RAW_OUTPUT")
    return raw


def derivatives(s: Staged) -> list[Any]:
    return [a for a in assets_of(s.ctx, s.task_id) if a.parent_asset_id is not None]


def reviews(s: Staged) -> list[Any]:
    with s.ctx.engine.connect() as conn:
        return list(conn.execute(sa.select(review_items).where(review_items.c.task_id == s.task_id)).all())


def assert_rejected(s: Staged, result: str, reason: str) -> None:
    """Gate or checksum rejection: final, the raw asset REJECTED with the reason, alert, no retry; the tenant is
    not charged for an output it never received (the vendor's bill is platform cost)."""
    assert result.startswith("failed: "), result
    task = task_row(s.ctx, s.task_id)
    assert task.status == "FAILED_FINAL" and task.last_error_class == "media_rejected"
    assert history(s.ctx, s.task_id)[-1] == ("POST_PROCESSING", "FAILED_FINAL")
    raw = raw_of(s)
    assert raw.status == "REJECTED" and reason in raw.error
    assert derivatives(s) == []
    assert sorted(a.rule for a in alerts_of(s.ctx)) == ["media_failed", "platform_cost"]
    (alert,) = alerts_of(s.ctx, "media_failed")
    assert alert.subject_id == str(s.task_id) and reason in alert.message
    assert pending(s.ctx, MEDIA, due_only=False) == []
    assert outbox_of(s.ctx, STATUS_CHANGED, s.task_id)[-1].payload["status"] == "FAILED_FINAL"
    assert reviews(s) == []
    assert_absorbed(s.ctx, s.task_id)


def replace_result(
    monkeypatch: pytest.MonkeyPatch, profile: DerivativeProfile, *, retryable: bool, error: str = "encoder crashed"
) -> list[int]:
    """Make `profile` fail in every build (the other profiles are built for real); returns a call counter."""
    real = derive.build_derivatives
    calls: list[int] = []

    def build(*args: Any, **kwargs: Any) -> dict[DerivativeProfile, derive.DerivativeResult]:
        calls.append(1)
        results = real(*args, **kwargs)
        results[profile] = derive.DerivativeResult(profile, "FAILED", error=error, retryable=retryable)
        return results

    monkeypatch.setattr(derive, "build_derivatives", build)
    return calls


# --- gate and checksum -----------------------------------------------------------------------------------


def test_stored_object_overwritten_after_fetch_fails_the_checksum_check(tmp_path: Path, sim: SimHandle) -> None:
    s = staged(tmp_path, sim)
    raw = raw_of(s)
    s.ctx.storage.put_stream(raw.object_key, [b"\x00\x00\x00\x18ftypmp42 swapped"], "video/mp4", 1 << 20)

    result = s.media()

    assert_rejected(s, result, "does not match the checksum recorded at fetch")
    s.ctx.close()


def test_valid_video_over_the_duration_limit_is_refused_by_the_gate(tmp_path: Path, sim: SimHandle) -> None:
    s = staged(tmp_path, sim, media={"max_duration_s": 0.5})
    raw = raw_of(s)
    assert read_object(s.ctx, raw.object_key) == sim_app.sample_mp4()  # what is stored is intact

    result = s.media()

    assert_rejected(s, result, "output refused by the media gate")
    assert "exceeds 0.5s" in raw_of(s).error
    s.ctx.close()


def test_provider_output_that_is_not_a_video_is_refused_by_the_gate(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    garbage = b"<html>oops, an error page served with status 200</html>" * 20
    monkeypatch.setattr(sim_app, "sample_mp4", lambda: garbage)  # the vendor's CDN serves junk
    s = staged(tmp_path, sim)
    assert raw_of(s).checksum_value == sha256(garbage)  # fetched and stored as served: the checksum holds

    result = s.media()

    assert_rejected(s, result, "output refused by the media gate")
    s.ctx.close()


# --- moderation ------------------------------------------------------------------------------------------


def test_prompt_matching_a_review_term_holds_the_output_for_a_human(tmp_path: Path, sim: SimHandle) -> None:
    s = staged(tmp_path, sim, prompt="A red FOX at dawn", media={"review_prompt_terms": ["fox"]})

    assert s.media() == "held for review"

    task = task_row(s.ctx, s.task_id)
    assert task.status == "MANUAL_REVIEW" and task.review_state == "PENDING"
    assert history(s.ctx, s.task_id)[-1] == ("POST_PROCESSING", "MANUAL_REVIEW")
    (item,) = reviews(s)
    raw = raw_of(s)
    assert item.state == "PENDING" and item.asset_id == raw.id
    assert item.reason == "prompt matches review term 'fox'"
    # the output itself is fine and playable: the human decides on a finished product
    assert raw.status == "READY" and raw.duration_ms and raw.width == 160
    assert {d.kind for d in derivatives(s) if d.status == "READY"} == REQUIRED
    assert_only_reserved(s.ctx, s.task_id)  # no SETTLE until the human decides
    assert alerts_of(s.ctx) == []
    assert pending(s.ctx, MEDIA, due_only=False) == []
    assert outbox_of(s.ctx, STATUS_CHANGED, s.task_id)[-1].payload["status"] == "MANUAL_REVIEW"
    s.ctx.close()


def test_a_request_input_moderation_warned_about_has_its_output_held_for_a_human(
    tmp_path: Path, sim: SimHandle
) -> None:
    s = staged(tmp_path, sim, prompt="a fox under a night sky", moderation={"warn_terms": ["night sky"]})

    assert s.media() == "held for review"

    task = task_row(s.ctx, s.task_id)
    assert task.status == "MANUAL_REVIEW" and task.review_state == "PENDING"
    (item,) = reviews(s)
    assert item.state == "PENDING" and item.reason == "input moderation: prompt contains the review term 'night sky'"
    assert_only_reserved(s.ctx, s.task_id)  # reserved, not settled: the reviewer decides
    s.ctx.close()


# --- derivatives: retry, escalate, fail ------------------------------------------------------------------


@pytest.mark.parametrize("manual", [True, False])
def test_retryable_derivative_failure_retries_then_escalates_past_the_budget(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch, manual: bool
) -> None:
    budget = {"max_attempts": 2, "base_delay_s": 5, "max_delay_s": 5, "manual_confirmation_required": manual}
    s = staged(tmp_path, sim, retry={"media": budget})
    calls = replace_result(monkeypatch, DerivativeProfile.PROXY_MP4, retryable=True)
    started = s.ctx.clock.now()

    first = s.media()

    assert first.startswith("retry: retry 2/2"), first
    task = task_row(s.ctx, s.task_id)
    assert task.status == "POST_PROCESSING"
    assert (task.last_error_class, task.last_error_code) == ("media_worker_crashed", "media_retry")
    (retry,) = pending(s.ctx, MEDIA, due_only=False)
    assert retry.payload["try"] == 2 and retry.payload["asset_id"] == str(raw_of(s).id)
    assert started < retry.available_at <= started + timedelta(seconds=5)
    assert pending(s.ctx, MEDIA) == []  # not due yet
    by_kind = {d.kind: d for d in derivatives(s)}
    assert by_kind["PROXY"].status == "FAILED" and by_kind["PROXY"].error == "encoder crashed"
    assert by_kind["HLS"].status == by_kind["THUMBNAIL"].status == "READY"
    assert_only_reserved(s.ctx, s.task_id)

    s.ctx.clock.advance(5)  # type: ignore[attr-defined]
    second = s.media()

    assert len(calls) == 2
    assert pending(s.ctx, MEDIA, due_only=False) == []
    assert len(derivatives(s)) == 3  # the second run updated the rows of the first, no duplicates
    if manual:  # default for media: a human confirms before anything more happens
        assert second == "held for review"
        assert task_row(s.ctx, s.task_id).status == "MANUAL_REVIEW"
        (item,) = reviews(s)
        assert item.state == "PENDING" and item.asset_id == raw_of(s).id
        assert "retry budget spent: 2/2" in item.reason and "proxy_mp4: encoder crashed" in item.reason
        assert_only_reserved(s.ctx, s.task_id)
        assert alerts_of(s.ctx) == []
    else:
        assert second.startswith("failed: ")
        assert task_row(s.ctx, s.task_id).status == "FAILED_FINAL"
        assert reviews(s) == []
        (alert,) = alerts_of(s.ctx, "media_failed")
        assert "proxy_mp4: encoder crashed" in alert.message
        assert_absorbed(s.ctx, s.task_id)
    s.ctx.close()


def test_retryable_derivative_failure_recovers_on_the_next_run(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = staged(tmp_path, sim, retry={"media": {"max_attempts": 3, "base_delay_s": 5, "max_delay_s": 5}})
    replace_result(monkeypatch, DerivativeProfile.HLS, retryable=True)
    assert s.media().startswith("retry: ")
    failed = {d.kind: d for d in derivatives(s)}
    assert failed["HLS"].status == "FAILED"

    monkeypatch.undo()
    s.ctx.clock.advance(5)  # type: ignore[attr-defined]
    assert s.media() == "succeeded"

    assert task_row(s.ctx, s.task_id).status == "SUCCEEDED"
    now = {d.kind: d for d in derivatives(s)}
    assert {k: d.id for k, d in now.items()} == {k: d.id for k, d in failed.items()}  # same rows, updated
    assert all(d.status == "READY" and d.error is None for d in now.values())
    assert_settled(s.ctx, s.task_id)
    assert outbox_of(s.ctx, STATUS_CHANGED, s.task_id)[-1].payload["status"] == "SUCCEEDED"
    s.ctx.close()


def test_non_retryable_derivative_failure_fails_the_task_at_once(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = staged(tmp_path, sim)
    replace_result(monkeypatch, DerivativeProfile.THUMBNAIL, retryable=False, error="no decodable frame")

    result = s.media()

    assert result.startswith("failed: thumbnail: no decodable frame"), result
    assert task_row(s.ctx, s.task_id).status == "FAILED_FINAL"
    assert pending(s.ctx, MEDIA, due_only=False) == []
    assert raw_of(s).status == "READY"  # the output itself passed the gate
    (alert,) = alerts_of(s.ctx, "media_failed")
    assert "no decodable frame" in alert.message
    assert reviews(s) == []
    assert_absorbed(s.ctx, s.task_id)
    s.ctx.close()


def test_optional_derivative_failure_does_not_hold_the_task(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = staged(tmp_path, sim)
    replace_result(monkeypatch, DerivativeProfile.WAVEFORM, retryable=False)

    assert s.media() == "succeeded"

    by_kind = {d.kind: d for d in derivatives(s)}
    assert by_kind["WAVEFORM"].status == "FAILED"
    assert {k for k, d in by_kind.items() if d.status == "READY"} == REQUIRED
    assert_settled(s.ctx, s.task_id)
    s.ctx.close()


def _probe_unavailable(*args: Any, **kwargs: Any) -> Any:
    raise ProbeUnavailable("ffprobe not found")


def _store_down(self: Any, key: str, path: Path) -> int:
    raise OSError("store unreachable")


def _object_gone(self: Any, key: str, path: Path) -> int:
    raise ObjectNotFound(key)


@pytest.mark.parametrize("breakage", ["probe", "object_gone"])
def test_failures_on_our_side_retry_without_judging_the_output(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch, breakage: str
) -> None:
    s = staged(tmp_path, sim)
    if breakage == "probe":
        monkeypatch.setattr(media_module, "probe_file", _probe_unavailable)
    else:
        monkeypatch.setattr(type(s.ctx.storage), "download_to", _object_gone)

    assert s.media().startswith("retry: ")

    assert task_row(s.ctx, s.task_id).status == "POST_PROCESSING"
    (retry,) = pending(s.ctx, MEDIA, due_only=False)
    assert retry.payload["try"] == 2
    assert raw_of(s).status == "PROCESSING" and raw_of(s).error is None  # not rejected: nothing was wrong with it
    assert derivatives(s) == [] and alerts_of(s.ctx) == []
    assert_only_reserved(s.ctx, s.task_id)
    s.ctx.close()


def test_a_store_outage_holds_the_task_without_spending_the_media_budget(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """: with our store down the task stays where it is. Before, each run against a down store
    spent a try, so an outage longer than the budget's delays sent good outputs to a human (CI, the degrade
    matrix's storage row: one task in MANUAL_REVIEW)."""
    s = staged(tmp_path, sim)
    budget = s.ctx.settings.retry.budget(Step.MEDIA).max_attempts
    (request,) = pending(s.ctx, MEDIA)
    real = type(s.ctx.storage).download_to
    monkeypatch.setattr(type(s.ctx.storage), "download_to", _store_down)

    for _ in range(budget + 2):  # the broker's and the sweeper's deliveries of the same request, past the budget
        with pytest.raises(OSError, match="store unreachable"):
            s.ctx.media.handle(envelope(request))

    assert task_row(s.ctx, s.task_id).status == "POST_PROCESSING"
    assert [r.id for r in pending(s.ctx, MEDIA, due_only=False)] == [request.id]  # no retry row: nothing spent
    assert raw_of(s).status == "PROCESSING" and raw_of(s).error is None
    assert derivatives(s) == [] and reviews(s) == []
    # the on-call engineer is told once per store, not once per delivery: the 5 failures bumped one alert
    (alert,) = alerts_of(s.ctx)
    store = f"{s.ctx.storage.kind} {s.ctx.storage.bucket}"
    assert (alert.rule, alert.severity, alert.status) == ("storage_unavailable", "critical", "OPEN")
    assert (alert.subject_type, alert.subject_id) == ("storage", store)
    assert alert.details == {"step": "media", "task_id": str(s.task_id), "error": "OSError: store unreachable"}
    assert "store unreachable" in alert.message and "nothing is failed or charged" in alert.message
    assert_only_reserved(s.ctx, s.task_id)

    monkeypatch.setattr(type(s.ctx.storage), "download_to", real)  # the store is back
    assert s.media() == "succeeded"
    assert task_row(s.ctx, s.task_id).status == "SUCCEEDED"
    assert {d.kind for d in derivatives(s) if d.status == "READY"} == REQUIRED
    assert_settled(s.ctx, s.task_id)
    s.ctx.close()


def test_a_late_rebuild_against_a_down_store_spends_a_try_of_its_schedule(
    tmp_path: Path, sim: SimHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `succeed_with_proxy_only` the task is SUCCEEDED before its late derivatives-only run: nothing holds it
    and the sweeper re-drives no finished task, so a store outage must not propagate out of that run (it would end
    in dead letters after the broker's few quick retries); it is retried later on the rebuild's own schedule."""
    s = staged(tmp_path, sim, media={"succeed_with_proxy_only": True})
    replace_result(monkeypatch, DerivativeProfile.HLS, retryable=True)
    assert s.media() == "succeeded on the proxy; hls to be rebuilt"
    (late,) = pending(s.ctx, MEDIA, due_only=False)
    assert late.payload["derivatives_only"] is True and late.payload["try"] == 1

    real = type(s.ctx.storage).download_to
    monkeypatch.setattr(type(s.ctx.storage), "download_to", _store_down)
    assert s.ctx.media.handle(envelope(late)) == "derivatives still missing: hls; retried later"
    (alert,) = alerts_of(s.ctx, "storage_unavailable")  # held or not, the store is down: on call is told
    assert alert.details["step"] == "media" and alert.details["task_id"] == str(s.task_id)
    (later,) = [r for r in pending(s.ctx, MEDIA, due_only=False) if r.id != late.id]
    assert later.payload["derivatives_only"] is True and later.payload["try"] == 2

    monkeypatch.setattr(type(s.ctx.storage), "download_to", real)  # the store and the segmenter are back
    monkeypatch.setattr(derive, "build_derivatives", _REAL_BUILD)
    assert s.ctx.media.handle(envelope(later)) == "derivatives rebuilt"
    assert task_row(s.ctx, s.task_id).status == "SUCCEEDED"
    assert {d.kind for d in derivatives(s) if d.status == "READY"} == REQUIRED
    assert_settled(s.ctx, s.task_id)
    s.ctx.close()


# --- derivative rows and duplicates --------------------------------------------------------------------------


def _assert_one_row_per_profile(s: Staged) -> None:
    raw = raw_of(s)
    pv = s.ctx.settings.media.pipeline_version
    rows = derivatives(s)
    keyset = [(d.parent_asset_id, d.profile, d.pipeline_version) for d in rows]
    assert sorted(p for _, p, _ in keyset) == ["hls", "proxy_mp4", "thumbnail"]  # no waveform: silent clip
    assert len(set(keyset)) == len(keyset) == 3
    for d in rows:
        assert d.parent_asset_id == raw.id and d.pipeline_version == pv and d.status == "READY"
        assert d.object_key.startswith(keys.derivative_prefix(s.tenant_id, raw.id, d.profile, pv))
        assert d.checksum_value == sha256(read_object(s.ctx, d.object_key)) and d.size_bytes
    assert raw.status == "READY" and raw.duration_ms == 1000 and (raw.width, raw.height) == (160, 90)


def test_derivative_rows_are_one_per_profile_and_a_duplicate_delivery_adds_none(tmp_path: Path, sim: SimHandle) -> None:
    s = staged(tmp_path, sim)
    (row,) = pending(s.ctx, MEDIA)
    env = envelope(row)

    assert s.ctx.media.handle(env) == "succeeded"
    _assert_one_row_per_profile(s)
    before = {d.id: (d.object_key, d.checksum_value) for d in derivatives(s)}
    assert s.ctx.media.handle(env) == "skipped: task is SUCCEEDED"

    assert {d.id: (d.object_key, d.checksum_value) for d in derivatives(s)} == before
    assert history(s.ctx, s.task_id).count(("POST_PROCESSING", "SUCCEEDED")) == 1
    assert_settled(s.ctx, s.task_id)
    s.ctx.close()


def test_two_runs_racing_on_one_envelope_record_once(tmp_path: Path, sim: SimHandle) -> None:
    """Both deliveries process before either commits (concurrent workers): the inbox row dedups the second
    commit, and both wrote the same deterministic derivative keys."""
    s = staged(tmp_path, sim)
    (row,) = pending(s.ctx, MEDIA)
    env = envelope(row)
    svc = s.ctx.media
    real = svc._process
    inner: list[str] = []

    def process_then_duplicate(*args: Any) -> Any:
        outcome = real(*args)
        if not inner:
            inner.append("running")
            inner.append(svc.handle(env))
        return outcome

    svc._process = process_then_duplicate  # type: ignore[method-assign]
    outer = svc.handle(env)

    assert inner[-1] == "succeeded" and outer == "duplicate"
    _assert_one_row_per_profile(s)
    assert history(s.ctx, s.task_id).count(("POST_PROCESSING", "SUCCEEDED")) == 1
    assert_settled(s.ctx, s.task_id)
    assert len([r for r in outbox_of(s.ctx, STATUS_CHANGED, s.task_id) if r.payload["status"] == "SUCCEEDED"]) == 1
    s.ctx.close()


def test_late_media_request_after_the_review_hold_changes_nothing(tmp_path: Path, sim: SimHandle) -> None:
    """Another media request for the same asset (new event id, e.g. a retry row racing the original) arriving
    after the first run held the task for review: skipped, no second review item, rows untouched."""
    s = staged(tmp_path, sim, media={"review_prompt_terms": ["boat"]})
    (row,) = pending(s.ctx, MEDIA)
    env = envelope(row)
    assert s.ctx.media.handle(env) == "held for review"
    first = {d.id: (d.status, d.object_key) for d in derivatives(s)}
    assert len(first) == 3

    assert s.ctx.media.handle(replace(env, event_id=uuid.uuid4())) == "skipped: task is MANUAL_REVIEW"

    assert {d.id: (d.status, d.object_key) for d in derivatives(s)} == first
    assert len(reviews(s)) == 1
    assert history(s.ctx, s.task_id).count(("POST_PROCESSING", "MANUAL_REVIEW")) == 1
    assert_only_reserved(s.ctx, s.task_id)
    s.ctx.close()


def _platform_cost_rows(s: Staged) -> list[tuple[Decimal, Decimal]]:
    c = credit_ledger.c
    with s.ctx.engine.connect() as conn:
        rows = conn.execute(
            sa.select(c.amount, c.vendor_amount).where(c.task_id == s.task_id, c.entry_type == "ADJUSTMENT")
        ).all()
    return [(Decimal(r.amount), Decimal(r.vendor_amount)) for r in rows]


def _advance(s: Staged, seconds: float) -> None:
    s.ctx.clock.advance(seconds)  # type: ignore[attr-defined]


def test_a_held_output_is_not_expired_by_the_deadline_and_the_review_sla_rejects_it_uncharged(
    tmp_path: Path, sim: SimHandle
) -> None:
    """The vendor produced the output and it is held for a person: the task's deadline no longer applies (it was
    expired and charged for nothing). `review_sla_near` at 80 % of the SLA; at the SLA the default verdict
    rejects it, the tenant pays nothing, and the vendor's bill is booked as platform cost with an alert."""
    s = staged(tmp_path, sim, prompt="a fox", media={"review_prompt_terms": ["fox"]}, review={"sla_s": 7200})
    assert s.media() == "held for review"
    task = task_row(s.ctx, s.task_id)
    _advance(s, (task.deadline_at - s.ctx.clock.now()).total_seconds() + 1)  # past the 1 h deadline

    assert s.ctx.sweeper.sweep().expired == 0
    assert task_row(s.ctx, s.task_id).status == "MANUAL_REVIEW"
    assert_only_reserved(s.ctx, s.task_id)
    assert not alerts_of(s.ctx, "review_sla_near")

    (held,) = reviews(s)
    _advance(s, (held.created_at + timedelta(seconds=7200 * 0.8) - s.ctx.clock.now()).total_seconds())
    assert s.ctx.sweeper.sweep().review_sla_decided == 0
    (near,) = alerts_of(s.ctx, "review_sla_near")
    assert near.subject_id == str(s.task_id)
    assert_only_reserved(s.ctx, s.task_id)

    _advance(s, 7200 * 0.2 + 1)  # past the SLA
    assert s.ctx.sweeper.sweep().review_sla_decided == 1
    task = task_row(s.ctx, s.task_id)
    (item,) = reviews(s)
    assert (task.status, task.review_state, task.last_error_class) == ("FAILED_FINAL", "REJECTED", "review_sla_passed")
    assert (item.state, item.decided_by) == ("REJECTED", "review-sla")
    estimate = Decimal(task.estimated_cost)
    assert ledger(s.ctx, s.task_id) == [("RESERVE", -estimate), ("RELEASE", estimate), ("ADJUSTMENT", Decimal(0))]
    assert Decimal(task.actual_cost) == 0
    assert _platform_cost_rows(s) == [(Decimal(0), estimate)]  # the sim billed the whole clip
    (cost,) = alerts_of(s.ctx, "platform_cost")
    assert cost.subject_id == str(s.task_id)
    s.ctx.close()


def test_the_review_sla_can_approve_a_playable_held_output_which_is_then_charged_once(
    tmp_path: Path, sim: SimHandle
) -> None:
    s = staged(
        tmp_path,
        sim,
        prompt="a fox",
        media={"review_prompt_terms": ["fox"]},
        review={"sla_s": 600, "on_sla": "approve"},
    )
    assert s.media() == "held for review"
    _advance(s, 601)
    assert s.ctx.sweeper.sweep().review_sla_decided == 1
    task = task_row(s.ctx, s.task_id)
    (item,) = reviews(s)
    assert (task.status, task.review_state, item.state) == ("SUCCEEDED", "APPROVED", "APPROVED")
    assert_settled(s.ctx, s.task_id)
    assert s.ctx.sweeper.sweep().review_sla_decided == 0  # decided once
    assert_settled(s.ctx, s.task_id)
    s.ctx.close()


def test_the_review_sla_never_approves_a_hold_without_a_playable_output(tmp_path: Path, sim: SimHandle) -> None:
    """Media kept failing past its budget (manual_confirmation_required): nothing a client can play, so even
    `on_sla = "approve"` rejects it, uncharged."""
    s = staged(tmp_path, sim, review={"sla_s": 600, "on_sla": "approve"}, retry={"media": {"max_attempts": 1}})
    broken = Outcome(unavailable="ffprobe is not installed")
    s.ctx.media._process = lambda *a: broken  # type: ignore[method-assign]
    assert s.media().startswith("held for review")
    _advance(s, 601)
    assert s.ctx.sweeper.sweep().review_sla_decided == 1
    task = task_row(s.ctx, s.task_id)
    assert (task.status, task.review_state) == ("FAILED_FINAL", "REJECTED")
    estimate = Decimal(task.estimated_cost)
    assert ledger(s.ctx, s.task_id) == [("RESERVE", -estimate), ("RELEASE", estimate), ("ADJUSTMENT", Decimal(0))]
    s.ctx.close()
