"""System B: the step state machine, the error codes, the per-step-type specs and the failure policy.

A project runs a workflow of typed steps; each step is one `workflow_task` row with exactly the seed's seven
statuses. Workers only report (success / failure + error code / progress); `decide_failure` and the step
machine say what the report means, and only the workflow service applies it. Pure: time comes in as `now`.

Statuses and their exits:
- pending → running (picked up) or cancelled.
- running → success; → retrying (a retryable error with tries left: 30 s, 2 min, 5 min); → failed (a
  non-retryable error, the final error codes); → manual_required (tries exhausted, a manual-review error such as a low
  face-consistency score or a moderation warning, a composition failure, or any failure of a premium project).
- retrying → running when due, or cancelled.
- failed / manual_required → pending on an explicit retry (the user's "retry entry", an operator's
  `projects retry-step`); manual_required → success when a reviewer approves it, → failed when one rejects it.
- success and cancelled are terminal.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import IntEnum, StrEnum

from aivedio_engine.domain.machine import Machine, Rule
from aivedio_engine.domain.retry import ErrorClass


class StepStatus(StrEnum):
    """The statuses of a workflow step."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    RETRYING = "retrying"
    CANCELLED = "cancelled"
    MANUAL_REQUIRED = "manual_required"


STEP_TERMINAL = frozenset({StepStatus.SUCCESS, StepStatus.CANCELLED})


class StepEvent(StrEnum):
    STARTED = "started"
    SUCCEEDED = "succeeded"
    RETRY_SCHEDULED = "retry_scheduled"
    FAILED_FINAL = "failed_final"
    ESCALATED = "escalated"
    RETRY_REQUESTED = "retry_requested"
    APPROVED = "approved"
    REJECTED = "rejected"
    CANCEL_REQUESTED = "cancel_requested"


S = StepStatus
E = StepEvent

STEP_MACHINE: Machine[StepStatus, StepEvent] = Machine(
    "step",
    StepStatus,
    StepEvent,
    initial=S.PENDING,
    terminal=STEP_TERMINAL,
    rules=[
        Rule((S.PENDING, S.RETRYING), E.STARTED, S.RUNNING, "a worker took it (retrying: its delay has passed)"),
        Rule((S.RUNNING,), E.SUCCEEDED, S.SUCCESS, "output asset recorded"),
        Rule((S.RUNNING,), E.RETRY_SCHEDULED, S.RETRYING, "retryable error, tries left: 30 s / 2 min / 5 min"),
        Rule((S.RUNNING,), E.FAILED_FINAL, S.FAILED, "non-retryable error"),
        Rule((S.RUNNING,), E.ESCALATED, S.MANUAL_REQUIRED, "tries exhausted or a condition: review item opened"),
        Rule((S.FAILED, S.MANUAL_REQUIRED), E.RETRY_REQUESTED, S.PENDING, "user or operator retry, same row"),
        Rule((S.MANUAL_REQUIRED,), E.APPROVED, S.SUCCESS, "a reviewer accepts the output"),
        Rule((S.MANUAL_REQUIRED,), E.REJECTED, S.FAILED, "a reviewer rejects it"),
        Rule(
            (S.PENDING, S.RUNNING, S.RETRYING, S.FAILED, S.MANUAL_REQUIRED),
            E.CANCEL_REQUESTED,
            S.CANCELLED,
            "a running step's generation task is canceled too; credits settle by its own rules",
        ),
    ],
)


class ErrorCode(StrEnum):
    """The error codes of a step, plus PLAN_LIMIT_CONFLICT: "套餐限制冲突" (a plan's limits
    conflict) as a non-retryable error but gives it no code."""

    TASK_TIMEOUT = "TASK_TIMEOUT"
    PROVIDER_TIMEOUT = "PROVIDER_TIMEOUT"
    PROVIDER_RATE_LIMIT = "PROVIDER_RATE_LIMIT"
    PROVIDER_ERROR = "PROVIDER_ERROR"
    INPUT_INVALID = "INPUT_INVALID"
    PHOTO_QUALITY_FAIL = "PHOTO_QUALITY_FAIL"
    PAYMENT_REQUIRED = "PAYMENT_REQUIRED"
    QUOTA_NOT_ENOUGH = "QUOTA_NOT_ENOUGH"
    MODERATION_REJECTED = "MODERATION_REJECTED"
    FFMPEG_FAILED = "FFMPEG_FAILED"
    STORAGE_FAILED = "STORAGE_FAILED"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"
    PLAN_LIMIT_CONFLICT = "PLAN_LIMIT_CONFLICT"
    # V3
    IDENTITY_ANCHOR_NOT_CONFIRMED = "IDENTITY_ANCHOR_NOT_CONFIRMED"
    FACE_CONSISTENCY_LOW = "FACE_CONSISTENCY_LOW"
    REAL_VIDEO_PROVIDER_DISABLED = "REAL_VIDEO_PROVIDER_DISABLED"
    REAL_VIDEO_CONFIRMATION_REQUIRED = "REAL_VIDEO_CONFIRMATION_REQUIRED"
    REAL_VIDEO_COST_LIMIT_EXCEEDED = "REAL_VIDEO_COST_LIMIT_EXCEEDED"
    REAL_VIDEO_CLIP_FAILED = "REAL_VIDEO_CLIP_FAILED"
    VIDEO_CLIP_QC_FAILED = "VIDEO_CLIP_QC_FAILED"
    LIPSYNC_FAILED = "LIPSYNC_FAILED"
    MINOR_MANUAL_REVIEW_REQUIRED = "MINOR_MANUAL_REVIEW_REQUIRED"
    # a moderation "warning" verdict: not a refusal, but a person must look
    MODERATION_WARNING = "MODERATION_WARNING"


class ErrorKind(StrEnum):
    RETRYABLE = "retryable"  # provider timeout, network, rate limit, temporary service error, ffmpeg hiccup
    FINAL = "final"  # bad photo, no balance, authorization not confirmed, moderation refused, plan limits
    MANUAL = "manual"  # /: a person decides (low similarity, moderation warning, a minor in the photo)


ERROR_KINDS: dict[ErrorCode, ErrorKind] = {
    ErrorCode.TASK_TIMEOUT: ErrorKind.RETRYABLE,
    ErrorCode.PROVIDER_TIMEOUT: ErrorKind.RETRYABLE,
    ErrorCode.PROVIDER_RATE_LIMIT: ErrorKind.RETRYABLE,
    ErrorCode.PROVIDER_ERROR: ErrorKind.RETRYABLE,
    ErrorCode.INPUT_INVALID: ErrorKind.FINAL,
    ErrorCode.PHOTO_QUALITY_FAIL: ErrorKind.FINAL,
    ErrorCode.PAYMENT_REQUIRED: ErrorKind.FINAL,
    ErrorCode.QUOTA_NOT_ENOUGH: ErrorKind.FINAL,
    ErrorCode.MODERATION_REJECTED: ErrorKind.FINAL,
    ErrorCode.FFMPEG_FAILED: ErrorKind.RETRYABLE,
    ErrorCode.STORAGE_FAILED: ErrorKind.RETRYABLE,
    ErrorCode.UNKNOWN_ERROR: ErrorKind.RETRYABLE,
    ErrorCode.PLAN_LIMIT_CONFLICT: ErrorKind.FINAL,
    ErrorCode.IDENTITY_ANCHOR_NOT_CONFIRMED: ErrorKind.FINAL,
    ErrorCode.FACE_CONSISTENCY_LOW: ErrorKind.MANUAL,
    ErrorCode.REAL_VIDEO_PROVIDER_DISABLED: ErrorKind.FINAL,
    ErrorCode.REAL_VIDEO_CONFIRMATION_REQUIRED: ErrorKind.FINAL,
    ErrorCode.REAL_VIDEO_COST_LIMIT_EXCEEDED: ErrorKind.FINAL,
    ErrorCode.REAL_VIDEO_CLIP_FAILED: ErrorKind.RETRYABLE,
    ErrorCode.VIDEO_CLIP_QC_FAILED: ErrorKind.RETRYABLE,
    ErrorCode.LIPSYNC_FAILED: ErrorKind.RETRYABLE,
    ErrorCode.MINOR_MANUAL_REVIEW_REQUIRED: ErrorKind.MANUAL,
    ErrorCode.MODERATION_WARNING: ErrorKind.MANUAL,
}

#: the generation engine's error classes as System B codes, for steps run as generation tasks
FROM_ERROR_CLASS: dict[ErrorClass, ErrorCode] = {
    ErrorClass.LOCAL_INVALID: ErrorCode.INPUT_INVALID,
    ErrorClass.PROVIDER_REJECTED: ErrorCode.PROVIDER_ERROR,
    ErrorClass.PROVIDER_RATE_LIMITED: ErrorCode.PROVIDER_RATE_LIMIT,
    ErrorClass.PROVIDER_5XX_NOT_ACCEPTED: ErrorCode.PROVIDER_ERROR,
    ErrorClass.CONNECT_FAILED: ErrorCode.PROVIDER_TIMEOUT,
    ErrorClass.SUBMIT_AMBIGUOUS: ErrorCode.PROVIDER_TIMEOUT,
    ErrorClass.QUERY_FAILED: ErrorCode.PROVIDER_TIMEOUT,
    ErrorClass.CALLBACK_PROCESSING_FAILED: ErrorCode.PROVIDER_ERROR,
    ErrorClass.OUTPUT_DOWNLOAD_TRANSIENT: ErrorCode.STORAGE_FAILED,
    ErrorClass.OUTPUT_URL_EXPIRED: ErrorCode.PROVIDER_ERROR,
    ErrorClass.MEDIA_WORKER_CRASHED: ErrorCode.FFMPEG_FAILED,
}


#: `last_error_class` values that are no row: the provider ran the job and reported it failed
_FROM_REDUCER: dict[str, ErrorCode] = {"provider_failed": ErrorCode.PROVIDER_ERROR}


def error_code_for(error_class: str | None) -> ErrorCode:
    """A generation task's `last_error_class` (or a free-form reason) as a System B code; unknown → UNKNOWN_ERROR."""
    if error_class in _FROM_REDUCER:
        return _FROM_REDUCER[error_class]
    try:
        return FROM_ERROR_CLASS[ErrorClass(error_class or "")]
    except ValueError:
        return ErrorCode.UNKNOWN_ERROR


class QueueName(StrEnum):
    """One queue per kind of work plus the V3 queues, each isolated with its own limits."""

    PHOTO_CHECK = "photo_check"
    TEXT = "text"
    IMAGE = "image"
    VIDEO = "video"
    VOICE = "voice"
    AUDIO = "audio"
    FFMPEG = "ffmpeg"
    QC = "qc"
    CLEANUP = "cleanup"
    NOTIFICATION = "notification"
    IDENTITY_ANCHOR = "identity_anchor"
    FACE_CONSISTENCY = "face_consistency"
    MOTION_PORTRAIT = "motion_portrait"
    REAL_VIDEO_CLIP = "real_video_clip"
    VIDEO_CLIP_QC = "video_clip_qc"
    LIPSYNC = "lipsync"


class Priority(IntEnum):
    """, 1 is served first: premium custom, paid formal, preview, free preview, cleanup."""

    PREMIUM = 1
    PAID_FORMAL = 2
    PREVIEW = 3
    FREE_PREVIEW = 4
    CLEANUP = 5


class Scope(StrEnum):
    """Who a step's concurrency limit counts against."""

    NONE = "none"
    PROJECT = "project"  # e.g. at most N image steps of one project at once
    PROJECT_SINGLE = "project_single"  # one at a time per project: composition
    PROVIDER = "provider"  # the provider's own QPS / concurrency (through the generation engine's slots)


class StepType(StrEnum):
    PHOTO_CHECK = "photo_check"
    PERSON_PROFILE = "person_profile"
    PLAN = "plan"
    PREVIEW_IMAGE = "preview_image"
    FINAL_IMAGE = "final_image"
    IMAGE_QC = "image_qc"
    VIDEO_CLIP = "video_clip"
    TTS = "tts"
    SUBTITLES = "subtitles"
    BGM = "bgm"
    COMPOSITION = "composition"
    FINAL_QC = "final_qc"
    MANUAL_REVIEW = "manual_review"
    DELIVERY = "delivery"
    CLEANUP = "cleanup"
    IDENTITY_ANCHOR = "identity_anchor"
    FACE_CONSISTENCY = "face_consistency"
    MOTION_PORTRAIT = "motion_portrait"
    REAL_VIDEO_CLIP = "real_video_clip"
    VIDEO_CLIP_QC = "video_clip_qc"
    LIPSYNC = "lipsync"


#: the 1st, 2nd and 3rd retry wait 30 s, 2 min, 5 min
RETRY_SCHEDULE_S: tuple[int, ...] = (30, 120, 300)
MAX_RETRY = 3


@dataclass(frozen=True, slots=True)
class StepSpec:
    type: StepType
    queue: QueueName
    timeout_s: int
    #: must run under the project lock `lock:project:{id}:workflow` (plan, composition, delivery)
    needs_lock: bool = False
    scope: Scope = Scope.NONE
    #: calls an AI vendor: runs as a generation task (reservation, reconciliation, settlement)
    vendor: bool = False
    #: a failure after the retries goes to a person rather than to `failed` (composition, image QC,...)
    escalate_on_failure: bool = False
    #: a failure does not block delivery of the rest (lip sync is optional)
    optional: bool = False
    max_retry: int = MAX_RETRY
    retry_schedule_s: tuple[int, ...] = RETRY_SCHEDULE_S


_M = 60
Q = QueueName
T = StepType
#: timeouts; queues /
STEP_SPECS: dict[StepType, StepSpec] = {
    T.PHOTO_CHECK: StepSpec(T.PHOTO_CHECK, Q.PHOTO_CHECK, 2 * _M),
    T.PERSON_PROFILE: StepSpec(T.PERSON_PROFILE, Q.TEXT, 3 * _M),
    T.PLAN: StepSpec(T.PLAN, Q.TEXT, 3 * _M, needs_lock=True),
    T.PREVIEW_IMAGE: StepSpec(T.PREVIEW_IMAGE, Q.IMAGE, 10 * _M, scope=Scope.PROJECT),
    T.FINAL_IMAGE: StepSpec(T.FINAL_IMAGE, Q.IMAGE, 10 * _M, scope=Scope.PROJECT),
    T.IMAGE_QC: StepSpec(T.IMAGE_QC, Q.QC, 10 * _M, escalate_on_failure=True),
    T.VIDEO_CLIP: StepSpec(T.VIDEO_CLIP, Q.VIDEO, 30 * _M, scope=Scope.PROVIDER, vendor=True),
    T.TTS: StepSpec(T.TTS, Q.VOICE, 5 * _M),
    T.SUBTITLES: StepSpec(T.SUBTITLES, Q.TEXT, 3 * _M),
    T.BGM: StepSpec(T.BGM, Q.AUDIO, 5 * _M),
    T.COMPOSITION: StepSpec(
        T.COMPOSITION, Q.FFMPEG, 30 * _M, needs_lock=True, scope=Scope.PROJECT_SINGLE, escalate_on_failure=True
    ),
    T.FINAL_QC: StepSpec(T.FINAL_QC, Q.QC, 10 * _M, escalate_on_failure=True),
    T.MANUAL_REVIEW: StepSpec(T.MANUAL_REVIEW, Q.QC, 10 * _M, max_retry=0),
    T.DELIVERY: StepSpec(T.DELIVERY, Q.NOTIFICATION, 5 * _M, needs_lock=True),
    T.CLEANUP: StepSpec(T.CLEANUP, Q.CLEANUP, 10 * _M),
    T.IDENTITY_ANCHOR: StepSpec(T.IDENTITY_ANCHOR, Q.IDENTITY_ANCHOR, 10 * _M, vendor=True, scope=Scope.PROVIDER),
    T.FACE_CONSISTENCY: StepSpec(T.FACE_CONSISTENCY, Q.FACE_CONSISTENCY, 3 * _M, escalate_on_failure=True),
    T.MOTION_PORTRAIT: StepSpec(T.MOTION_PORTRAIT, Q.MOTION_PORTRAIT, 20 * _M, vendor=True, scope=Scope.PROVIDER),
    T.REAL_VIDEO_CLIP: StepSpec(T.REAL_VIDEO_CLIP, Q.REAL_VIDEO_CLIP, 60 * _M, vendor=True, scope=Scope.PROVIDER),
    T.VIDEO_CLIP_QC: StepSpec(T.VIDEO_CLIP_QC, Q.VIDEO_CLIP_QC, 10 * _M, escalate_on_failure=True),
    T.LIPSYNC: StepSpec(T.LIPSYNC, Q.LIPSYNC, 45 * _M, vendor=True, scope=Scope.PROVIDER, optional=True),
}


@dataclass(frozen=True, slots=True)
class FailureDecision:
    event: StepEvent
    to_status: StepStatus
    retry_count: int
    #: when the step runs again (retrying only)
    next_attempt_at: datetime | None
    reason: str


def decide_failure(
    spec: StepSpec, retry_count: int, code: ErrorCode, now: datetime, *, premium: bool = False
) -> FailureDecision:
    """What a failed run of a step becomes. `retry_count` is the number of retries already made.

    Retryable errors wait 30 s, 2 min, 5 min (the spec's schedule) for up to `max_retry` retries; past them the
    step goes to a person (`manual_required`). Non-retryable errors end in
    `failed`, except where a person must decide: manual-kind codes, steps whose failure sends to review
    (composition, QC), and every step of a premium project."""
    kind = ERROR_KINDS[code]
    if kind is ErrorKind.MANUAL:
        return FailureDecision(E.ESCALATED, S.MANUAL_REQUIRED, retry_count, None, f"{code}: a person must decide")
    if kind is ErrorKind.RETRYABLE and retry_count < spec.max_retry:
        delay = spec.retry_schedule_s[min(retry_count, len(spec.retry_schedule_s) - 1)]
        return FailureDecision(
            E.RETRY_SCHEDULED,
            S.RETRYING,
            retry_count + 1,
            now + timedelta(seconds=delay),
            f"{code}: retry {retry_count + 1} of {spec.max_retry} in {delay} s",
        )
    exhausted = kind is ErrorKind.RETRYABLE
    if exhausted or spec.escalate_on_failure or premium:
        why = (
            f"failed {retry_count + 1} times"
            if exhausted
            else ("premium project" if premium else f"{spec.type} failures go to review")
        )
        return FailureDecision(E.ESCALATED, S.MANUAL_REQUIRED, retry_count, None, f"{code}: {why}")
    return FailureDecision(E.FAILED_FINAL, S.FAILED, retry_count, None, f"{code}: not retryable")


def timed_out(spec: StepSpec, started_at: datetime | None, now: datetime) -> bool:
    """A running step past its type's timeout: the sweeper asks the provider first, then fails it."""
    return started_at is not None and now - started_at > timedelta(seconds=spec.timeout_s)
