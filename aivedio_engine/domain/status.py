"""Every status and kind string of the product, spelled once.

SQL CHECK constraints in `sql/migrations/` list the same values; a test fails if the two drift.
The task and attempt machines are described in `transitions.py`; this module only names things.
"""

from __future__ import annotations

from enum import StrEnum


class TaskStatus(StrEnum):
    """Lifecycle of a generation task."""

    CREATED = "CREATED"
    VALIDATING = "VALIDATING"
    QUOTA_RESERVED = "QUOTA_RESERVED"
    QUEUED = "QUEUED"
    DISPATCHING = "DISPATCHING"
    SUBMITTED = "SUBMITTED"
    RUNNING = "RUNNING"
    OUTPUT_FETCHING = "OUTPUT_FETCHING"
    POST_PROCESSING = "POST_PROCESSING"
    SUCCEEDED = "SUCCEEDED"
    #: the submit call got no answer we can trust: the provider may or may not have a job.
    SUBMIT_UNKNOWN = "SUBMIT_UNKNOWN"
    RETRY_WAIT = "RETRY_WAIT"
    CANCEL_REQUESTED = "CANCEL_REQUESTED"
    CANCELED = "CANCELED"
    FAILED_FINAL = "FAILED_FINAL"
    EXPIRED = "EXPIRED"
    #: output held for a human after post-processing.
    MANUAL_REVIEW = "MANUAL_REVIEW"

    @property
    def is_terminal(self) -> bool:
        return self in TASK_TERMINAL


TASK_TERMINAL: frozenset[TaskStatus] = frozenset(
    {TaskStatus.SUCCEEDED, TaskStatus.CANCELED, TaskStatus.FAILED_FINAL, TaskStatus.EXPIRED}
)

#: what a user is told (once the provider has produced the video, "generated, processing",
#: however long fetching and post-processing take, e.g. while the media cluster or the store is down)
GENERATED_PROCESSING = "generated, processing"
USER_STAGE: dict[TaskStatus, str] = {
    **{s: "queued" for s in (TaskStatus.CREATED, TaskStatus.VALIDATING, TaskStatus.QUOTA_RESERVED, TaskStatus.QUEUED)},
    **{
        s: "generating"
        for s in (
            TaskStatus.DISPATCHING,
            TaskStatus.SUBMITTED,
            TaskStatus.RUNNING,
            TaskStatus.SUBMIT_UNKNOWN,
            TaskStatus.RETRY_WAIT,
            TaskStatus.CANCEL_REQUESTED,
        )
    },
    TaskStatus.OUTPUT_FETCHING: GENERATED_PROCESSING,
    TaskStatus.POST_PROCESSING: GENERATED_PROCESSING,
    TaskStatus.MANUAL_REVIEW: "in review",
    TaskStatus.SUCCEEDED: "done",
    TaskStatus.CANCELED: "canceled",
    TaskStatus.FAILED_FINAL: "failed",
    TaskStatus.EXPIRED: "expired",
}


class AttemptStatus(StrEnum):
    """One call to a provider."""

    NEW = "NEW"
    SENDING = "SENDING"
    ACKED = "ACKED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"
    #: the request may have reached the provider; only reconciliation may decide.
    UNKNOWN = "UNKNOWN"
    #: confirmed with high confidence that the provider never accepted it.
    FAILED_BEFORE_ACCEPT = "FAILED_BEFORE_ACCEPT"

    @property
    def is_terminal(self) -> bool:
        return self in ATTEMPT_TERMINAL


ATTEMPT_TERMINAL: frozenset[AttemptStatus] = frozenset(
    {
        AttemptStatus.SUCCEEDED,
        AttemptStatus.FAILED,
        AttemptStatus.CANCELED,
        AttemptStatus.FAILED_BEFORE_ACCEPT,
    }
)

#: attempts that may hold a provider job or be about to create one; at most one per task.
ATTEMPT_IN_FLIGHT: frozenset[AttemptStatus] = frozenset(
    {AttemptStatus.NEW, AttemptStatus.SENDING, AttemptStatus.ACKED, AttemptStatus.RUNNING, AttemptStatus.UNKNOWN}
)


class CancelOutcome(StrEnum):
    CANCELED = "CANCELED"
    TOO_LATE = "TOO_LATE"
    UNSUPPORTED = "UNSUPPORTED"


class AssetKind(StrEnum):
    INPUT_IMAGE = "INPUT_IMAGE"
    INPUT_VIDEO = "INPUT_VIDEO"
    RAW_OUTPUT = "RAW_OUTPUT"
    PROXY = "PROXY"
    HLS = "HLS"
    THUMBNAIL = "THUMBNAIL"
    WAVEFORM = "WAVEFORM"


class AssetStatus(StrEnum):
    UPLOADING = "UPLOADING"
    VALIDATING = "VALIDATING"
    PROCESSING = "PROCESSING"
    READY = "READY"
    REJECTED = "REJECTED"
    FAILED = "FAILED"
    DELETED = "DELETED"


class UploadSessionStatus(StrEnum):
    OPEN = "OPEN"
    COMPLETED = "COMPLETED"
    EXPIRED = "EXPIRED"
    ABORTED = "ABORTED"


class OutboxStatus(StrEnum):
    PENDING = "PENDING"
    PUBLISHED = "PUBLISHED"
    DEAD = "DEAD"


class LedgerEntryType(StrEnum):
    """Sign convention: RESERVE −estimate, SETTLE +estimate−actual, RELEASE +estimate, ADJUSTMENT ±."""

    RESERVE = "RESERVE"
    SETTLE = "SETTLE"
    RELEASE = "RELEASE"
    REFUND = "REFUND"
    ADJUSTMENT = "ADJUSTMENT"


class StateEventOutcome(StrEnum):
    """What the reducer did with an observation; ignored ones are recorded too."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    STALE = "stale"
    ILLEGAL = "illegal"
    ANOMALY = "anomaly"


class EventSource(StrEnum):
    API = "api"
    SCHEDULER = "scheduler"
    CALLBACK = "callback"
    POLLING = "polling"
    WORKER = "worker"
    SWEEPER = "sweeper"
    ADMIN = "admin"


class ReviewState(StrEnum):
    PENDING = "PENDING"
    CLAIMED = "CLAIMED"
    APPROVED = "APPROVED"
    REJECTED = "REJECTED"
    EXPIRED = "EXPIRED"  # the task passed its deadline while waiting for a reviewer


class ModerationVerdict(StrEnum):
    """The input moderator's answer: pass, pass but a human looks at the output, refuse."""

    ALLOW = "allow"
    WARN = "warn"
    REJECT = "reject"


class AlertSeverity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class AlertStatus(StrEnum):
    OPEN = "OPEN"
    ACKNOWLEDGED = "ACKNOWLEDGED"
    RESOLVED = "RESOLVED"


#: the filter words of `alerts list --status` (the CLI's completion reads them without loading the services);
#: "unresolved" = OPEN and ACKNOWLEDGED
ALERT_LIST_STATUSES = ("unresolved", "open", "acknowledged", "resolved", "all")


class TenantStatus(StrEnum):
    ACTIVE = "ACTIVE"
    SUSPENDED = "SUSPENDED"


class DerivativeProfile(StrEnum):
    PROXY_MP4 = "proxy_mp4"
    HLS = "hls"
    THUMBNAIL = "thumbnail"
    WAVEFORM = "waveform"


class CallbackRejectReason(StrEnum):
    """Why a provider callback failed verification (`callback_rejections.reason`, the metric's `reason` label)."""

    #: unsigned, or signed by no key or token we hold (a forgery, or a secret rotated on one side only)
    SIGNATURE = "signature"
    #: signed too long ago or in the future: a replay, or a skewed clock
    TIMESTAMP = "timestamp"
    #: we hold no secret or key to verify it with (the provider's webhook settings are missing)
    NOT_CONFIGURED = "not_configured"
    #: the body is not what the provider sends (not JSON, not a job, too large)
    MALFORMED = "malformed"


class WebhookDeliveryState(StrEnum):
    """One client webhook delivery (endpoint × event): FAILED is "last attempt failed, another is scheduled";
    DEAD is "the retry budget is spent" (or the endpoint is gone), until an operator replays it."""

    PENDING = "PENDING"
    DELIVERED = "DELIVERED"
    FAILED = "FAILED"
    DEAD = "DEAD"


#: every enum whose values a SQL CHECK constraint must list, keyed by "table.column".
CHECKED_COLUMNS: dict[str, type[StrEnum]] = {
    "tenants.status": TenantStatus,
    "assets.kind": AssetKind,
    "assets.status": AssetStatus,
    "upload_sessions.status": UploadSessionStatus,
    "generation_tasks.status": TaskStatus,
    "generation_tasks.cancel_outcome": CancelOutcome,
    "task_attempts.submit_state": AttemptStatus,
    "task_state_events.outcome": StateEventOutcome,
    "task_state_events.source": EventSource,
    "outbox_events.status": OutboxStatus,
    "credit_ledger.entry_type": LedgerEntryType,
    "review_items.state": ReviewState,
    "generation_tasks.review_state": ReviewState,
    "assets.profile": DerivativeProfile,
    "alerts.severity": AlertSeverity,
    "alerts.status": AlertStatus,
    "webhook_deliveries.state": WebhookDeliveryState,
    "callback_rejections.reason": CallbackRejectReason,
}
