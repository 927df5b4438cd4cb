"""The provider Protocol and the values adapters exchange with the engine.

Adapters translate one vendor's API into these types and nothing more: no retries, no database, no sleeps.
Whether a failure may be retried is decided by the engine's failure policy from the `ErrorClass` an adapter
reports; whether a submit is ambiguous (the request may have reached the vendor) is the adapter's one
judgement call, because only it knows when the request body left the process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from aivedio_engine.domain.references import ModelLimits
from aivedio_engine.domain.retry import ErrorClass
from aivedio_engine.domain.status import CallbackRejectReason


class JobStatus(StrEnum):
    """A vendor's job status, normalised. Vendor spellings map onto these in each adapter."""

    QUEUED = "queued"  # accepted, waiting (Runway PENDING, Replicate starting, Kling submitted, fal IN_QUEUE)
    THROTTLED = "throttled"  # accepted, held back by the vendor's concurrency limit (Runway THROTTLED)
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    ABORTED = "aborted"  # ended before it started (Replicate aborted): not billed


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What the engine asks a provider to make. Reference files are already in our store; adapters get URLs."""

    prompt: str
    model: str
    duration_s: int
    resolution: str
    aspect_ratio: str
    seed: int | None = None
    #: reference images in the client's order (image-to-video reads the first)
    reference_urls: Sequence[str] = ()
    #: reference videos, for vendors with video-to-video
    reference_video_urls: Sequence[str] = ()
    callback_url: str | None = None
    #: outputs (variants) asked for; only adapters whose models allow more than one see n > 1 (the catalog)
    n: int = 1


@dataclass(frozen=True, slots=True)
class Output:
    url: str
    expires_at: datetime | None = None
    content_type: str | None = None
    size_bytes: int | None = None
    index: int = 0


@dataclass(frozen=True, slots=True)
class Observation:
    """One fact a provider told us about a job, from a callback or a poll."""

    job_id: str
    status: JobStatus
    provider_updated_at: datetime | None = None
    progress: int | None = None  # 0–100, display only
    outputs: tuple[Output, ...] = ()
    error_code: str | None = None
    error_message: str | None = None
    billed: bool | None = None  # the vendor's billing verdict when it gives one
    #: What the vendor says it billed, when it says so (None: it did not; the price list × the requested seconds
    #: then stands). Settlement reads these from the attempt row: `domain/settlement.py`.
    #: output seconds charged (the sim; a vendor's own units × the provider's `vendor_unit_seconds`)
    billed_seconds: float | None = None
    billed_outputs: int | None = None  # outputs charged
    #: the vendor's own charge figure in its own unit (Kling `final_unit_deduction`, Replicate
    #: `metrics.predict_time`, fal `metrics.inference_time`): recorded for reconciliation, never read as credits
    vendor_cost: float | None = None
    #: the vendor gave the charge back: it voided the job, or failed it by its own moderation after charging
    refunded: bool | None = None
    request_key: str | None = None  # our provider_request_key, when the vendor echoes it
    #: stable id of the event for dedupe (webhook id); None for polls — the reducer fingerprints those.
    event_id: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)

    @property
    def cost(self) -> float | None:
        """The vendor's own charge figure (older name of `vendor_cost`)."""
        return self.vendor_cost

    def billed_units(self) -> dict[str, Any]:
        """The billing facts the reducer records on the attempt (keys of `to_payload`)."""
        return {
            "billed_seconds": self.billed_seconds,
            "billed_outputs": self.billed_outputs,
            "vendor_cost": self.vendor_cost,
            "refunded": self.refunded,
        }


def units_to_seconds(units: float | None, seconds_per_unit: float | None) -> float | None:
    """A vendor's own billed units as output seconds, with the provider's configured rate (None: unknown)."""
    if units is None or seconds_per_unit is None:
        return None
    return round(units * seconds_per_unit, 3)


@dataclass(frozen=True, slots=True)
class JobSummary:
    """One job in a vendor's listing of recent jobs, for matching an ambiguous submit."""

    job_id: str
    created_at: datetime
    status: JobStatus
    #: `providers.fingerprint.request_fingerprint` of the request the vendor echoes for this job; None when the
    #: echo is missing or unreadable — then the job may be anyone's, ours included.
    fingerprint: bytes | None


@dataclass(frozen=True, slots=True)
class Accepted:
    job_id: str
    observation: Observation | None = None


@dataclass(frozen=True, slots=True)
class Rejected:
    """The vendor certainly did not create a job (validation error, 429, 5xx before accept, connect failure)."""

    error_class: ErrorClass
    code: str | None = None
    message: str | None = None
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Ambiguous:
    """The request may have reached the vendor (timeout or disconnect after sending): reconcile, never resubmit."""

    reason: str


SubmitResult = Accepted | Rejected | Ambiguous


@dataclass(frozen=True, slots=True)
class NotFound:
    """The vendor has no job for this key. For a fresh job id this may only mean 'not visible yet'."""


@dataclass(frozen=True, slots=True)
class Unsupported:
    """The vendor cannot do this (e.g. no lookup by request key, no cancel)."""


@dataclass(frozen=True, slots=True)
class QueryFailed:
    error_class: ErrorClass
    message: str | None = None
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Canceled:
    pass


@dataclass(frozen=True, slots=True)
class TooLate:
    """The job finished before the cancel took effect."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    models: tuple[str, ...]
    max_duration_s: int
    resolutions: tuple[str, ...]
    supports_callbacks: bool
    supports_lookup_by_request_key: bool
    supports_cancel: bool
    output_url_ttl_s: int | None
    #: vendor billing rule for a canceled job: True when a cancel after start is still charged
    cancel_is_billed: bool = True
    #: how references reach the vendor: "url" (a short-lived signed GET) or "file" (a local path: `local`)
    reference_transport: str = "url"
    #: per model: reference counts and sizes, aspect ratios, durations (`domain.references`); the catalog shows
    #: them and `POST /v1/generations` enforces them before anything is reserved
    model_limits: Mapping[str, ModelLimits] = field(default_factory=dict)

    def limits_for(self, model: str) -> ModelLimits:
        return self.model_limits.get(model) or ModelLimits()


class CallbackRejected(Exception):
    """Signature, timestamp or body is not acceptable: the caller answers 4xx and stores nothing of the request but
    `reason` (`callback_rejections`); a body that is not what the vendor sends is the default."""

    def __init__(self, message: str, reason: CallbackRejectReason = CallbackRejectReason.MALFORMED) -> None:
        super().__init__(message)
        self.reason = reason


@runtime_checkable
class Provider(Protocol):
    name: str
    capabilities: Capabilities

    def submit(self, request: GenerationRequest, request_key: str) -> SubmitResult: ...

    def query(self, job_id: str) -> Observation | NotFound | QueryFailed: ...

    def find(self, request_key: str) -> Observation | NotFound | Unsupported | QueryFailed: ...

    def cancel(self, job_id: str) -> Canceled | TooLate | Unsupported | QueryFailed: ...

    def list_jobs(
        self, created_after: datetime, created_before: datetime
    ) -> list[JobSummary] | Unsupported | QueryFailed:
        """Every job the vendor created in [created_after, created_before), all pages; Unsupported when the vendor
        cannot list. Optional for the engine (a provider without it is treated as Unsupported), but a listing must
        be complete or fail: a missing page could hide the one job that proves a submit was received."""
        ...

    def parse_callback(self, headers: Mapping[str, str], raw_body: bytes, now: datetime) -> list[Observation]:
        """Verify the signature over the raw body (raise CallbackRejected), then parse."""
        ...
