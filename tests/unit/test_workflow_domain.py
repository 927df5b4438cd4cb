"""System B's pure core: the step machine edge by edge, the failure policy, specs, the DAG, projects."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from aivedio_engine.domain.project import (
    PROJECT_MACHINE,
    ProjectStatus,
    StepDef,
    WorkflowDef,
    WorkflowError,
    derive_status,
    project_event,
    ready_steps,
)
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.domain.workflow import (
    ERROR_KINDS,
    FROM_ERROR_CLASS,
    STEP_MACHINE,
    STEP_SPECS,
    ErrorCode,
    ErrorKind,
    QueueName,
    StepEvent,
    StepStatus,
    StepType,
    decide_failure,
    error_code_for,
    timed_out,
)
from aivedio_engine.workflows.catalog import PHOTO_STORY, WORKFLOWS, get

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
S = StepStatus
E = StepEvent

# Every allowed (state, event) → target of the step machine; anything else must be refused.
STEP_EDGES = {
    (S.PENDING, E.STARTED): S.RUNNING,
    (S.RETRYING, E.STARTED): S.RUNNING,
    (S.RUNNING, E.SUCCEEDED): S.SUCCESS,
    (S.RUNNING, E.RETRY_SCHEDULED): S.RETRYING,
    (S.RUNNING, E.FAILED_FINAL): S.FAILED,
    (S.RUNNING, E.ESCALATED): S.MANUAL_REQUIRED,
    (S.FAILED, E.RETRY_REQUESTED): S.PENDING,
    (S.MANUAL_REQUIRED, E.RETRY_REQUESTED): S.PENDING,
    (S.MANUAL_REQUIRED, E.APPROVED): S.SUCCESS,
    (S.MANUAL_REQUIRED, E.REJECTED): S.FAILED,
    (S.PENDING, E.CANCEL_REQUESTED): S.CANCELLED,
    (S.RUNNING, E.CANCEL_REQUESTED): S.CANCELLED,
    (S.RETRYING, E.CANCEL_REQUESTED): S.CANCELLED,
    (S.FAILED, E.CANCEL_REQUESTED): S.CANCELLED,
    (S.MANUAL_REQUIRED, E.CANCEL_REQUESTED): S.CANCELLED,
}


def test_step_statuses_are_exactly_the_seeds_seven() -> None:
    assert [s.value for s in StepStatus] == [
        "pending",
        "running",
        "success",
        "failed",
        "retrying",
        "cancelled",
        "manual_required",
    ]


@pytest.mark.parametrize("state", list(StepStatus))
@pytest.mark.parametrize("event", list(StepEvent))
def test_every_step_edge(state: StepStatus, event: StepEvent) -> None:
    edge = STEP_MACHINE.edge(state, event)
    expected = STEP_EDGES.get((state, event))
    assert (edge.target if edge else None) == expected


def test_success_and_cancelled_are_sticky() -> None:
    for state in (S.SUCCESS, S.CANCELLED):
        assert STEP_MACHINE.targets(state) == set()
    assert STEP_MACHINE.reachable_from(S.PENDING) == set(StepStatus)


def test_every_error_code_has_a_kind_and_every_engine_class_a_code() -> None:
    assert set(ERROR_KINDS) == set(ErrorCode)
    assert set(FROM_ERROR_CLASS) == set(ErrorClass)
    assert error_code_for("provider_rate_limited") is ErrorCode.PROVIDER_RATE_LIMIT
    assert error_code_for("something new") is ErrorCode.UNKNOWN_ERROR
    assert error_code_for(None) is ErrorCode.UNKNOWN_ERROR


def test_seed_lists_of_retryable_and_final_errors() -> None:
    final = {ErrorCode.PHOTO_QUALITY_FAIL, ErrorCode.QUOTA_NOT_ENOUGH, ErrorCode.PAYMENT_REQUIRED}
    final |= {ErrorCode.IDENTITY_ANCHOR_NOT_CONFIRMED, ErrorCode.MODERATION_REJECTED, ErrorCode.PLAN_LIMIT_CONFLICT}
    retryable = {ErrorCode.PROVIDER_TIMEOUT, ErrorCode.PROVIDER_ERROR, ErrorCode.PROVIDER_RATE_LIMIT}
    retryable |= {ErrorCode.FFMPEG_FAILED}
    assert {c for c in final if ERROR_KINDS[c] is not ErrorKind.FINAL} == set()
    assert {c for c in retryable if ERROR_KINDS[c] is not ErrorKind.RETRYABLE} == set()


def test_retry_schedule_is_30s_2min_5min_then_manual_required() -> None:
    spec = STEP_SPECS[StepType.FINAL_IMAGE]
    waits = []
    count = 0
    now = NOW
    while True:
        d = decide_failure(spec, count, ErrorCode.PROVIDER_TIMEOUT, now)
        if d.to_status is not S.RETRYING:
            break
        assert d.event is E.RETRY_SCHEDULED and d.next_attempt_at is not None
        waits.append((d.next_attempt_at - now).total_seconds())
        count, now = d.retry_count, d.next_attempt_at
    assert waits == [30, 120, 300]
    assert (d.to_status, d.event, d.retry_count) == (S.MANUAL_REQUIRED, E.ESCALATED, 3)


def test_non_retryable_fails_at_once_unless_a_person_must_decide() -> None:
    image = STEP_SPECS[StepType.FINAL_IMAGE]
    d = decide_failure(image, 0, ErrorCode.PHOTO_QUALITY_FAIL, NOW)
    assert (d.to_status, d.retry_count, d.next_attempt_at) == (S.FAILED, 0, None)
    # composition failure, QC, manual-kind codes and premium projects go to a person
    assert decide_failure(STEP_SPECS[StepType.COMPOSITION], 0, ErrorCode.INPUT_INVALID, NOW).to_status is (
        S.MANUAL_REQUIRED
    )
    assert decide_failure(image, 0, ErrorCode.FACE_CONSISTENCY_LOW, NOW).to_status is S.MANUAL_REQUIRED
    assert decide_failure(image, 0, ErrorCode.MODERATION_WARNING, NOW).to_status is S.MANUAL_REQUIRED
    assert decide_failure(image, 0, ErrorCode.PHOTO_QUALITY_FAIL, NOW, premium=True).to_status is S.MANUAL_REQUIRED


def test_specs_follow_the_seed_timeouts_and_queues() -> None:
    minutes = {t: STEP_SPECS[t].timeout_s // 60 for t in StepType}
    assert minutes[StepType.PHOTO_CHECK] == 2
    assert minutes[StepType.PLAN] == 3
    assert minutes[StepType.FINAL_IMAGE] == 10
    assert minutes[StepType.VIDEO_CLIP] == 30
    assert minutes[StepType.TTS] == 5
    assert minutes[StepType.COMPOSITION] == 30
    assert minutes[StepType.FINAL_QC] == 10
    assert [minutes[t] for t in (StepType.IDENTITY_ANCHOR, StepType.FACE_CONSISTENCY, StepType.MOTION_PORTRAIT)] == [
        10,
        3,
        20,
    ]
    assert [minutes[t] for t in (StepType.REAL_VIDEO_CLIP, StepType.VIDEO_CLIP_QC, StepType.LIPSYNC)] == [60, 10, 45]
    assert {s.type for s in STEP_SPECS.values() if s.needs_lock} == {
        StepType.PLAN,
        StepType.COMPOSITION,
        StepType.DELIVERY,
    }
    assert {s.queue for s in STEP_SPECS.values()} <= set(QueueName)
    assert STEP_SPECS[StepType.REAL_VIDEO_CLIP].queue is QueueName.REAL_VIDEO_CLIP  # isolated
    assert STEP_SPECS[StepType.LIPSYNC].optional


def test_timed_out() -> None:
    spec = STEP_SPECS[StepType.PHOTO_CHECK]
    assert not timed_out(spec, NOW, NOW + timedelta(seconds=120))
    assert timed_out(spec, NOW, NOW + timedelta(seconds=121))
    assert not timed_out(spec, None, NOW)


def test_workflow_definitions_are_checked() -> None:
    with pytest.raises(WorkflowError, match="unknown"):
        WorkflowDef("w", "", (StepDef("a", StepType.PLAN, ("b",)),))
    with pytest.raises(WorkflowError, match="cycle"):
        WorkflowDef("w", "", (StepDef("a", StepType.PLAN, ("b",)), StepDef("b", StepType.TTS, ("a",))))
    with pytest.raises(WorkflowError, match="duplicate"):
        WorkflowDef("w", "", (StepDef("a", StepType.PLAN), StepDef("a", StepType.TTS)))
    assert get("photo_story") is PHOTO_STORY and set(WORKFLOWS) == {"photo_story"}
    with pytest.raises(KeyError, match="known: photo_story"):
        get("nope")


def test_ready_steps_follow_the_dag_and_pair_shots_by_index() -> None:
    wf = PHOTO_STORY
    assert ready_steps(wf, {}, None) == ["photo_check"]
    st = {"photo_check": S.SUCCESS}
    assert ready_steps(wf, st, None) == ["plan"]
    st["plan"] = S.SUCCESS
    assert ready_steps(wf, st, 2) == ["image[0]", "image[1]", "voice", "music"]
    st.update({"image[0]": S.SUCCESS, "image[1]": S.RUNNING, "voice": S.RUNNING, "music": S.RUNNING})
    assert ready_steps(wf, st, 2) == ["image_qc[0]"]  # image_qc[1] waits for image[1] only
    st.update({"image_qc[0]": S.SUCCESS, "image[1]": S.SUCCESS, "image_qc[1]": S.RETRYING})
    assert ready_steps(wf, st, 2) == ["clip[0]"]


def test_project_status_is_derived_from_its_steps() -> None:
    wf = PHOTO_STORY
    assert derive_status(wf, {}, None) is ProjectStatus.CREATED
    assert derive_status(wf, {"photo_check": S.RUNNING}, None) is ProjectStatus.RUNNING
    assert derive_status(wf, {"photo_check": S.FAILED}, None) is ProjectStatus.FAILED
    assert derive_status(wf, {"photo_check": S.MANUAL_REQUIRED}, None) is ProjectStatus.NEEDS_ATTENTION
    done = {i: S.SUCCESS for i in wf.instances(2)}
    assert derive_status(wf, done, 2) is ProjectStatus.SUCCEEDED
    assert derive_status(wf, {**done, "delivery": S.RUNNING}, 2) is ProjectStatus.RUNNING


def test_project_events_follow_the_machine() -> None:
    p = ProjectStatus
    assert project_event(p.CREATED, p.RUNNING) is not None
    assert project_event(p.RUNNING, p.RUNNING) is None
    assert project_event(p.NEEDS_ATTENTION, p.RUNNING) is not None  # resumed after a retry or an approval
    assert project_event(p.SUCCEEDED, p.RUNNING) is None  # terminal
    assert PROJECT_MACHINE.targets(p.CANCELLED) == set()
