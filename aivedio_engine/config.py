"""The one configuration model.

Precedence, highest first: values passed by the caller (CLI arguments) > `AIVEDIO_*` environment variables
(nested with `__`, e.g. `AIVEDIO_DATABASE__URL`) > the TOML file > the defaults below. The TOML file is the
`--config PATH` given, else `$AIVEDIO_CONFIG`, else `./aivedio.toml` when it exists.

No module-level instance: `load_settings()` is called once by the composition root and passed down.
Unknown keys are errors, so a typo in `aivedio.toml` fails loudly instead of silently using a default.
"""

from __future__ import annotations

import os
import re
import tomllib
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

# re-exported: callers import these from here
from aivedio_engine.config_files import (  # noqa: F401
    CONFIG_ENV_VAR,
    DEFAULT_CONFIG_FILE,
    ConfigError,
    merge_overrides,
    parse_override,
    resolve_config_path,
)
from aivedio_engine.domain.retry import DEFAULT_BUDGETS, RetryBudget, Step
from aivedio_engine.domain.status import DerivativeProfile
from aivedio_engine.domain.workflow import STEP_SPECS, QueueName, StepType


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseSettings(_Section):
    #: SQLAlchemy URL. Empty: a SQLite file `aivedio.db` in the data dir (embedded mode).
    url: str = ""
    #: connections each process keeps open to the database (SQLAlchemy pool size). An API process on PostgreSQL
    #: has a second pool of up to as many for the create route on its event loop (db/async_pool.py).
    pool_size: int = Field(10, ge=1, le=200)
    #: server-side statement timeout for the short transactions, in milliseconds (PostgreSQL only).
    statement_timeout_ms: int = Field(5000, ge=100)
    #: how long a request waits for a connection before answering 503.
    connect_timeout_s: float = Field(1.5, gt=0)


class BrokerSettings(_Section):
    #: "stub": Dramatiq StubBroker with in-process worker threads (embedded); "rabbitmq": RabbitmqBroker, push
    #: delivery (the distributed default); "redis": RedisBroker, whose idle consumers poll.
    kind: Literal["stub", "redis", "rabbitmq"] = "stub"
    #: amqp://user:pass@host:5672/vhost for rabbitmq (the vhost isolates a deployment), redis://... for redis.
    url: str = "redis://127.0.0.1:6379/0"
    #: Dramatiq consumer idle timeout; ≤ 100 ms keeps end-to-end latency low.
    consumer_idle_timeout_ms: int = Field(100, ge=10)
    #: Dramatiq worker threads per worker process.
    worker_threads: int = Field(4, ge=1, le=64)
    #: up to this many provider status observations of one relay claim go as one message, reduced in one
    #: transaction (services/reducer_batch.py); 1 sends each alone.
    reducer_batch: int = Field(32, ge=1, le=500)

    @model_validator(mode="after")
    def _url_fits_kind(self) -> BrokerSettings:
        schemes = {"rabbitmq": ("amqp://", "amqps://"), "redis": ("redis://", "rediss://", "unix://")}.get(self.kind)
        if schemes and not self.url.startswith(schemes):
            raise ValueError(f"broker.url must start with {' or '.join(schemes)} when broker.kind = {self.kind}")
        return self


class RedisSettings(_Section):
    #: slots, rate limits and pub/sub in distributed mode; unused in embedded mode.
    url: str = "redis://127.0.0.1:6379/0"
    #: prefix of every Redis key this deployment writes (several deployments can share one Redis).
    key_prefix: str = "aivedio:"


class StorageSettings(_Section):
    kind: Literal["fs", "s3"] = "fs"
    #: fs: directory of the local object store; empty means `<data_dir>/objects`.
    root: str = ""
    #: s3: the bucket that holds every object (references, raw outputs, derivatives).
    bucket: str = "aivedio"
    endpoint_url: str = ""
    #: s3: the bucket's region.
    region: str = "us-east-1"
    #: s3 access key; from the environment only, like every secret.
    access_key_id: SecretStr = SecretStr("")
    #: s3 secret key; from the environment only.
    secret_access_key: SecretStr = SecretStr("")
    #: HMAC key for the fs store's signed URLs. Empty: generated once and kept in the data dir.
    signing_key: SecretStr = SecretStr("")
    #: lifetime of upload targets (presigned POST / signed URL), ≤ 900 s.
    upload_url_ttl_s: int = Field(900, ge=10, le=900)
    #: lifetime of the signed playback URLs of a generation's outputs.
    playback_url_ttl_s: int = Field(3600, ge=10, le=86400)
    #: lifetime of the signed URLs through which a provider reads a task's reference images/videos
    reference_url_ttl_s: int = Field(3600, ge=60, le=86400)
    #: part size of multipart uploads to S3 (S3's minimum is 5 MiB).
    multipart_part_bytes: int = Field(8 * 1024 * 1024, ge=5 * 1024 * 1024)
    #: s3: server-side encryption asked on every write (PUT, multipart, the client's upload POST): "" leaves it
    #: to the bucket's default, "AES256" is SSE-S3, "aws:kms" is SSE-KMS with sse_kms_key_id (empty: the
    #: account's default KMS key).
    server_side_encryption: Literal["", "AES256", "aws:kms"] = ""
    sse_kms_key_id: str = ""

    @model_validator(mode="after")
    def _kms_key_needs_kms(self) -> StorageSettings:
        if self.sse_kms_key_id and self.server_side_encryption != "aws:kms":
            raise ValueError('sse_kms_key_id is set: server_side_encryption must be "aws:kms"')
        return self


class ApiSettings(_Section):
    #: address `aivedio serve --role api` listens on (`--host` wins).
    host: str = "127.0.0.1"
    #: port `aivedio serve --role api` listens on (`--port` wins).
    port: int = Field(8000, ge=1, le=65535)
    #: base URL that signed links point at; empty means http://host:port.
    public_base_url: str = ""
    max_body_bytes: int = Field(1024 * 1024, ge=1024)
    #: per-tenant request rate limit (requests per second, token bucket) for POST /v1/generations; a tenant's
    #: own `rate_limit_per_s` (tenants update --rate-limit) wins.
    tenant_rate_limit_per_s: float = Field(50.0, gt=0)
    #: the bucket's size: requests a tenant may send at once after being idle; a tenant's own value wins.
    tenant_rate_burst: int = Field(100, ge=1)
    #: share of a tenant's rate (and burst) each API process grants on its own while Redis is unreachable
    #: (distributed mode); with N API processes, 1/N keeps the total at the configured rate.
    tenant_rate_fallback_share: float = Field(0.25, gt=0, le=1)
    max_upload_bytes: int = Field(2 * 1024 * 1024 * 1024, ge=1)
    #: seconds an API process trusts a key it has verified: a key revoked elsewhere is refused within this
    auth_cache_ttl_s: float = Field(5, ge=0, le=5)
    #: seconds between `: ping` comments on an idle event stream (keeps proxies from closing it).
    sse_heartbeat_s: float = Field(15, gt=0)
    #: open event streams one API process serves at once; more get 429 with Retry-After.
    sse_max_streams: int = Field(5000, ge=1)
    #: open event streams of one tenant in one API process; more get 429 with Retry-After.
    sse_max_streams_per_tenant: int = Field(200, ge=1)
    #: the Retry-After (seconds) of a refused stream.
    sse_retry_after_s: int = Field(5, ge=1)
    #: a stream whose write has not drained for this long (the client stopped reading and the socket's buffer is
    #: full) is evicted: its slot, subscription and reads are freed.
    sse_send_timeout_s: float = Field(30, gt=0)
    #: most events one write carries; a stream that fell further behind (a burst, a late resume) gets the newest
    #: ones, so a client sees the latest state rather than an unbounded backlog.
    sse_max_batch_events: int = Field(50, ge=1)


class ModelSettings(_Section):
    #: longest output a request may ask for, in seconds.
    max_duration_s: int = Field(10, ge=1)
    #: resolutions a request may ask for; each needs a price_per_second entry.
    resolutions: list[str] = ["720p"]
    #: price per output second, by resolution, in credits.
    price_per_second: dict[str, Decimal] = {"720p": Decimal("1")}
    #: a task for this model may move to or from this provider when its provider fails (needs
    #: `[retry.submit] provider_switch_allowed` too; see domain/provider_switch.py).
    provider_switch: bool = True
    #: outputs (variants) one request may ask for with `n` (1-4); capped by what the provider's adapter can
    #: make for this model (only `local` and `sim` make more than one).
    max_outputs: int = Field(1, ge=1, le=4)

    @model_validator(mode="after")
    def _priced(self) -> ModelSettings:
        missing = [r for r in self.resolutions if r not in self.price_per_second]
        if not self.resolutions or missing:
            raise ValueError(f"every resolution needs a price_per_second entry (missing: {missing or 'all'})")
        return self


class ProviderSettings(_Section):
    #: false: the provider is configured but takes no new task.
    enabled: bool = True
    #: adapter name: local, sim, runway, replicate, fal, kling.
    adapter: str = "local"
    #: the vendor API's base URL; empty: the adapter's default.
    base_url: str = ""
    #: the vendor API key; from the environment only.
    api_key: SecretStr = SecretStr("")
    #: Standard Webhooks secrets; several are accepted during a rotation.
    webhook_secrets: list[SecretStr] = []
    #: hosts the output fetcher may download from (label-boundary match).
    output_hosts: list[str] = []
    #: allow plain http to the provider's own origin (only for local and sim).
    allow_http_origin: bool = False
    #: tasks in flight at this provider at once (the provider level of admission).
    max_concurrency: int = Field(4, ge=1)
    models: dict[str, ModelSettings] = {}
    #: the vendor can find a job by our request key, so an ambiguous submit can be reconciled.
    supports_lookup_by_request_key: bool = True
    #: seconds a provider output URL stays valid.
    output_url_ttl_s: int = Field(3600, ge=1)
    #: output seconds one unit of the vendor's own charge figure stands for (Kling `final_unit_deduction`,
    #: Replicate `predict_time`, fal `inference_time`): billed seconds = units × this, priced by the model's
    #: price list. None: the vendor's figure is recorded, and the price list × the requested seconds stands.
    vendor_unit_seconds: float | None = Field(None, gt=0)
    #: credits one unit of this vendor's invoice currency is worth (`aivedio ledger reconcile --apply`).
    invoice_credits_per_unit: Decimal = Field(Decimal("1"), gt=0)


class LimitsSettings(_Section):
    platform_max_concurrency: int = Field(64, ge=1)
    #: tasks one tenant may have in flight at providers, unless the tenant has its own limit.
    tenant_default_max_concurrency: int = Field(8, ge=1)
    tenant_default_credits: Decimal = Decimal("1000")
    default_deadline_s: int = Field(3600, ge=10)
    slot_lease_ttl_s: int = Field(60, ge=5)
    #: upload sessions (presigned targets) one tenant may open per minute; more answer 429.
    uploads_per_tenant_per_min: int = Field(120, ge=1)
    #: new generations get 503 + Retry-After while an outbox row has been due this long (0 = never)
    shed_outbox_age_s: float = Field(300, ge=0)
    #: tenants whose priority tier is at most this (1 custom project, 2 paid, ...) are admitted even then
    shed_exempt_tier: int | None = Field(None, ge=1)
    #: Redis (the slot store) unreachable: "pg_count" dispatches from the in-flight attempts
    #: in PostgreSQL under limits scaled by redis_down_fraction, one scheduler at a time; "pause" stops new
    #: dispatch until Redis answers again. Either way nothing is failed, re-reserved or resubmitted.
    redis_down_dispatch: Literal["pg_count", "pause"] = "pg_count"
    #: the share of every admission limit used while dispatching from PostgreSQL counts (at least 1 slot).
    redis_down_fraction: float = Field(0.5, gt=0, le=1)


class RetryBudgetSettings(_Section):
    """One step's retry budget."""

    #: attempts of the step, the first one included.
    max_attempts: int = Field(ge=1, le=100)
    #: seconds of retry delays at most, counted from the first failure.
    max_total_wait_s: float = Field(gt=0)
    #: seconds from the start of the step after which it is not retried any more.
    deadline_s: float = Field(gt=0)
    #: delay before retry n is uniform(0, min(max_delay_s, base_delay_s × multiplier^n)) (full jitter).
    base_delay_s: float = Field(gt=0)
    #: growth of the delay cap from one retry to the next.
    multiplier: float = Field(ge=1)
    #: cap of one delay.
    max_delay_s: float = Field(gt=0)
    #: another provider offering the model may take the task (only [retry.submit]).
    provider_switch_allowed: bool
    #: a human must confirm before the step is retried.
    manual_confirmation_required: bool

    @model_validator(mode="after")
    def _cap_not_below_base(self) -> RetryBudgetSettings:
        if self.max_delay_s < self.base_delay_s:
            raise ValueError("max_delay_s must be >= base_delay_s")
        return self

    def to_domain(self) -> RetryBudget:
        return RetryBudget(**self.model_dump())


def _default_budget(step: Step) -> RetryBudgetSettings:
    return RetryBudgetSettings(**DEFAULT_BUDGETS[step].as_dict())


class SubmitBudgetSettings(RetryBudgetSettings):
    """The submit step's retry budget (the shape every step shares), and how late its one vendor call may leave."""

    #: a send not started this many seconds after its attempt was claimed (SENDING) is refused: the sweeper may
    #: already have made the attempt ambiguous and a lookup found nothing, so a late request could make a
    #: second paid job. Plus the provider's HTTP timeouts it must stay below `sweeper.idle_grace_s`.
    send_deadline_s: float = Field(20, gt=0)

    def to_domain(self) -> RetryBudget:
        return RetryBudget(**self.model_dump(exclude={"send_deadline_s"}))


class RetrySettings(_Section):
    submit: SubmitBudgetSettings = Field(
        default_factory=lambda: SubmitBudgetSettings(**DEFAULT_BUDGETS[Step.SUBMIT].as_dict())
    )
    query: RetryBudgetSettings = Field(default_factory=lambda: _default_budget(Step.QUERY))
    output_fetch: RetryBudgetSettings = Field(default_factory=lambda: _default_budget(Step.OUTPUT_FETCH))
    media: RetryBudgetSettings = Field(default_factory=lambda: _default_budget(Step.MEDIA))
    notification: RetryBudgetSettings = Field(default_factory=lambda: _default_budget(Step.NOTIFICATION))

    @field_validator("*", mode="before")
    @classmethod
    def _fill_from_defaults(cls, value: Any, info: ValidationInfo) -> Any:
        """A partial `[retry.<step>]` table keeps the step's defaults for the keys it does not set."""
        if isinstance(value, dict):
            return {**DEFAULT_BUDGETS[Step(str(info.field_name))].as_dict(), **value}
        return value

    @field_validator("query", "output_fetch", "media", "notification")
    @classmethod
    def _switch_only_on_submit(cls, value: RetryBudgetSettings) -> RetryBudgetSettings:
        # the key exists on every step (one budget shape), but only a submit can change provider
        if value.provider_switch_allowed:
            raise ValueError("provider_switch_allowed: only [retry.submit] can move a task to another provider")
        return value

    def budget(self, step: Step) -> RetryBudget:
        return getattr(self, step.value).to_domain()


class ReconcileSettings(_Section):
    #: look the job up by request key this many seconds after the ambiguous submit.
    lookup_after_s: list[float] = [10, 60, 300]
    #: still unknown after this: park the task and raise an alert, never resubmit blindly.
    park_after_s: float = Field(900, gt=0)
    #: a lookup's "no such job" is only believed this long after the send (a vendor's listing may lag its
    #: writes); must be shorter than park_after_s, or a submit that never reached the vendor is always parked.
    visibility_lag_s: float = Field(60, ge=0)
    #: for a provider that cannot look jobs up: after the window, resubmit (with a cost-risk alert) instead of
    #: parking the task for a human. Off by default: a duplicate paid job is possible.
    resubmit_without_lookup: bool = False

    @model_validator(mode="after")
    def _lag_within_window(self) -> ReconcileSettings:
        if self.visibility_lag_s >= self.park_after_s:
            raise ValueError(
                f"reconcile.visibility_lag_s ({self.visibility_lag_s:g}) must be below reconcile.park_after_s "
                f"({self.park_after_s:g}): a submit the vendor never got could not be told apart before parking"
            )
        return self


class WebhookSettings(_Section):
    #: provider callbacks with a signed timestamp further than this from now are refused.
    tolerance_s: int = Field(300, ge=1)
    #: largest provider callback body accepted.
    max_body_bytes: int = Field(256 * 1024, ge=1024)
    #: days a consumed message's id is kept in the inbox to drop redeliveries; a dead letter older than this is
    #: refused by `aivedio replay dlq` (its inbox row may be gone, so a replay could apply it twice).
    dedup_retention_days: int = Field(7, ge=1)


class ClientWebhookSettings(_Section):
    """Signed webhooks to clients' endpoints (`aivedio webhooks`); the retry budget is `[retry.notification]`."""

    #: deliver to private, loopback and link-local addresses too (tests, on-premises receivers)
    allow_private_networks: bool = False
    #: seconds to connect to a client's endpoint.
    connect_timeout_s: float = Field(3, gt=0)
    #: one attempt's whole budget (connect, send, response); an endpoint slower than this fails the attempt
    timeout_s: float = Field(10, gt=0, le=120)
    #: bytes of the receiver's answer read at most (the rest is dropped; only the status code matters)
    max_response_bytes: int = Field(64 * 1024, ge=0)
    #: attempts to one endpoint in flight at once per worker process: a hanging endpoint holds at most this
    #: many worker threads, so the other tenants' deliveries keep flowing
    max_in_flight_per_endpoint: int = Field(2, ge=1, le=64)
    #: after `webhooks rotate`, the old secret keeps signing (a second signature) this long
    rotation_grace_s: int = Field(86_400, ge=0)


class FetchSettings(_Section):
    #: redirects the output fetcher follows, each re-checked against the policy.
    max_redirects: int = Field(3, ge=0, le=10)
    #: seconds to connect to the provider's output host.
    connect_timeout_s: float = Field(5, gt=0)
    #: seconds without a byte before a download is abandoned.
    idle_timeout_s: float = Field(30, gt=0)
    #: seconds one download may take in all.
    total_timeout_s: float = Field(600, gt=0)
    #: a download slower than this (after its first seconds) is abandoned.
    min_bytes_per_s: int = Field(64 * 1024, ge=0)
    #: largest output downloaded.
    max_bytes: int = Field(2 * 1024 * 1024 * 1024, ge=1)
    #: a fetch whose output URL expires within this many seconds goes to the urgent fetch queue.
    urgent_within_s: float = Field(900, ge=0)
    #: fetch pressure: while at least this many fetching outputs expire within
    #: urgent_within_s, new dispatch runs under pressure_dispatch_fraction of the platform limit, leaving
    #: bandwidth to the outputs about to expire (0 = never).
    pressure_urgent_outputs: int = Field(1, ge=0)
    pressure_dispatch_fraction: float = Field(0.5, gt=0, le=1)


class SandboxSettings(_Section):
    """How every ffprobe/ffmpeg child is isolated; `aivedio doctor` shows what applies here."""

    #: a network namespace of its own (nothing reachable); needs unshare and a kernel that allows it.
    network_isolation: bool = True
    #: when the engine is root: each job's children run as a uid of their own from the pool below (numeric,
    #: no passwd entry needed), which makes max_processes a per-job limit.
    user_isolation: bool = True
    uid_base: int = Field(61_000, ge=1000, le=2**31 - 1024)
    uid_count: int = Field(32, ge=1, le=1024)
    #: processes + threads of one job (pool uids only: a shared uid would count the engine's own threads).
    max_processes: int = Field(256, ge=16)
    #: the largest file a child may write (RLIMIT_FSIZE).
    max_file_bytes: int = Field(4 * 1024**3, ge=1024**2)
    #: the job directory's total size; a watchdog kills the child beyond it.
    max_disk_bytes: int = Field(8 * 1024**3, ge=1024**2)


class MediaSettings(_Section):
    #: derivatives that must be READY before a task may succeed.
    required_profiles: list[DerivativeProfile] = [
        DerivativeProfile.PROXY_MP4,
        DerivativeProfile.HLS,
        DerivativeProfile.THUMBNAIL,
    ]
    #: derivatives made when they apply (a waveform needs audio); a task does not wait for them.
    optional_profiles: list[DerivativeProfile] = [DerivativeProfile.WAVEFORM]
    #: part of every derivative key; 2 since one ffmpeg run writes all derivatives (HLS init bytes changed)
    pipeline_version: int = Field(3, ge=1)
    #: ffprobe gate: largest frame (width × height) accepted.
    max_pixels: int = Field(3840 * 2160, ge=1)
    #: ffprobe gate: lowest frame rate accepted.
    min_fps: float = Field(1, gt=0)
    #: ffprobe gate: highest frame rate accepted.
    max_fps: float = Field(120, gt=0)
    #: ffprobe gate: most streams in one file.
    max_streams: int = Field(4, ge=1)
    #: ffprobe gate: longest output accepted, in seconds (also capped by the model's limit).
    max_duration_s: float = Field(60, gt=0)
    #: seconds one ffprobe/ffmpeg run may take in the sandbox.
    timeout_s: float = Field(600, gt=0)
    #: memory cap of one ffmpeg run in the sandbox.
    memory_limit_bytes: int = Field(2 * 1024 * 1024 * 1024, ge=64 * 1024 * 1024)
    #: output moderation: a prompt containing one of these terms holds the output for a human.
    review_prompt_terms: list[str] = []
    #: a fetch whose outputs total at most this many bytes goes straight on to the media step in the same worker
    #: run (still two recorded steps); larger outputs, and workers not consuming the media queue, queue it. 0: never.
    inline_after_fetch_max_bytes: int = Field(16 * 1024 * 1024, ge=0)
    #: when the proxy MP4 is READY but another required derivative (HLS, thumbnail) failed,
    #: True lets the task succeed with the failed ones kept as retryable derivatives; False keeps it in
    #: POST_PROCESSING (retried within the media budget).
    succeed_with_proxy_only: bool = False
    sandbox: SandboxSettings = SandboxSettings()


class ModerationSettings(_Section):
    """Input moderation: the prompt and the references of every generation request,
    after validation and before any credit is reserved."""

    #: "rules" (the built-in term lists and image rules below) or "package.module:factory", a callable taking the
    #: Settings and returning an object with `check(ModerationInput) -> ModerationResult` (services/moderation.py).
    moderator: str = "rules"
    #: a prompt containing one of these terms (whole words, any case) is refused: 422 `moderation-rejected`.
    reject_terms: list[str] = []
    #: a prompt containing one of these terms is accepted, and its output is held for a human (MANUAL_REVIEW).
    warn_terms: list[str] = []
    #: detected formats a reference image may have; any other is refused.
    image_formats: list[str] = ["image/png", "image/jpeg", "image/webp"]
    #: largest reference image accepted, in bytes.
    max_image_bytes: int = Field(20 * 1024 * 1024, ge=1)
    #: shortest side a reference image may have, in pixels (smaller ones are refused).
    min_image_side: int = Field(16, ge=1)
    #: largest reference image accepted, in pixels (width × height).
    max_image_pixels: int = Field(4096 * 4096, ge=1)


class ReviewSettings(_Section):
    """Outputs held for a human (MANUAL_REVIEW): how long a held task may wait for a verdict. The task's deadline no
    longer runs once the vendor produced an output; this SLA does."""

    #: seconds from the hold to the SLA verdict.
    sla_s: float = Field(86400, ge=60)
    #: share of the SLA after which an open item raises `review_sla_near`.
    sla_near_fraction: float = Field(0.8, gt=0, lt=1)
    #: the verdict at the SLA on a held output that is playable: "reject" (release the credits, the vendor's bill
    #: is platform cost) or "approve" (deliver it, charged as a success). A hold without a playable output (store,
    #: media or fetch failing) is never approved: it is rejected.
    on_sla: Literal["reject", "approve"] = "reject"


class PollingSettings(_Section):
    #: shortest interval between two status queries of one job.
    min_interval_s: float = Field(5, ge=1)
    #: longest interval between two status queries of one job.
    max_interval_s: float = Field(60, ge=1)
    #: random share added to each interval, so polls spread out.
    jitter: float = Field(0.2, ge=0, lt=1)
    #: status queries per second to one provider, at most.
    provider_query_budget_per_s: float = Field(20, gt=0)


class SweeperSettings(_Section):
    #: seconds between two sweeper rounds.
    interval_s: float = Field(10, gt=0)
    #: an attempt left SENDING this long (its worker died between the send and recording the answer) is treated
    #: as an ambiguous submit, and a submit message not consumed this long is published again. It must stay above
    #: `[retry.submit] send_deadline_s` plus each provider's HTTP timeouts (checked at load), or a send still on
    #: its way is reconciled instead of recorded.
    idle_grace_s: float = Field(120, gt=0)
    #: each step's own budget: idle this long with nothing pending, it is driven on from the stored facts.
    #: a provider observation stored but never applied (its message lost) is reduced again from its row, and an
    #: ACKED/RUNNING attempt of a task that ended is closed (its slot freed, its job stopped).
    observation_stuck_s: float = Field(30, gt=0)
    #: an output fetch with no progress and no pending request this long is published again.
    fetch_stuck_s: float = Field(120, gt=0)
    #: a media step (probe, derivatives) with no progress and no pending request this long is published again;
    #: above the longest transcode, or a live run is duplicated (harmless, but paid in CPU).
    media_stuck_s: float = Field(300, gt=0)
    #: upload sessions whose URL expired this long ago without an upload are expired and cleaned up.
    abandoned_upload_s: float = Field(86_400, gt=0)
    #: the object store is listed for orphan objects when the newest storage_scans row is this old.
    storage_scan_interval_s: float = Field(3600, gt=0)
    #: an object younger than this is never an orphan: its fetch or media run may not have committed yet.
    storage_scan_grace_s: float = Field(3600, ge=0)
    #: the sweeper deletes orphan objects (as the scan defines them) older than storage_gc_grace_s, one page of
    #: storage_gc_page listed objects every storage_gc_interval_s, resuming where the last page stopped.
    storage_gc_enabled: bool = True
    #: the safety window: far longer than any fetch or media run between its upload and its commit.
    storage_gc_grace_s: float = Field(86_400, ge=3600)
    storage_gc_interval_s: float = Field(300, gt=0)
    storage_gc_page: int = Field(1000, ge=1, le=100_000)
    #: a rejected upload stays in quarantine this long (for an operator to inspect), then the sweeper deletes it.
    rejected_upload_grace_s: float = Field(86_400, ge=0)


class RetentionSettings(_Section):
    """How long data is kept. Tenant data: days after a task ended (outputs, prompts) or an
    input was uploaded; 0 keeps it forever; `aivedio tenants update --retention-*` overrides it per tenant. The
    engine's bookkeeping: days after a row stopped being needed; the inbox follows `webhooks.dedup_retention_days`."""

    #: output videos and their derivatives of tasks that ended this many days ago are deleted (0: kept).
    outputs_days: int = Field(0, ge=0)
    #: uploaded inputs this many days old are deleted unless an unfinished task uses them (0: kept).
    inputs_days: int = Field(0, ge=0)
    #: prompts of tasks that ended this many days ago are redacted (0: kept).
    prompts_days: int = Field(0, ge=0)
    #: published outbox rows this old are deleted (PENDING and DEAD rows are kept).
    outbox_days: int = Field(7, ge=1)
    #: state events of tasks that ended this many days ago are deleted (an unfinished task keeps its history).
    state_events_days: int = Field(90, ge=1)
    #: provider events received this many days ago are deleted (an unmatched one only once its alert expired), and
    #: the counts of callbacks that failed verification (`callback_rejections`) as old.
    provider_events_days: int = Field(30, ge=1)
    #: finished webhook deliveries (delivered, failed, dead) this many days old are deleted.
    webhook_deliveries_days: int = Field(30, ge=1)
    #: the sweeper applies retention at most this often, deleting at most `batch` rows per short transaction.
    interval_s: float = Field(3600, gt=0)
    batch: int = Field(500, ge=1, le=10_000)


class WorkflowSettings(_Section):
    """System B: queue limits checked when a step is claimed, and the lost-wake-up recovery."""

    #: image steps of one project running at once; composition is always one per project.
    project_max_image_steps: int = Field(2, ge=1)
    #: running steps per step queue across the deployment; real_video_clip and lipsync are capped on their
    #: own so costly video work never holds the workers that images and composition need. Other queues: no cap.
    queue_max_running: dict[str, int] = {"real_video_clip": 2, "lipsync": 2}
    #: provider QPS: vendor steps (those that create a generation task) started per second, per provider
    #: (a bucket of that many tokens, at least one). Their generation tasks' concurrency is the provider's
    #: `max_concurrency` slots. A provider not listed has no step rate of its own.
    provider_steps_per_s: dict[str, float] = {}
    #: a step due this long and still not claimed gets its queue's wake-up message again from the sweeper (the
    #: message was lost, or the broker queue was down); the step row is the truth, the message only a wake-up.
    redrive_after_s: float = Field(60, gt=0)
    #: credits a local step (one not run as a generation task) costs, per step type (photo_check, tts, composition,
    #: ...), added once to its actual cost when it succeeds (not booked in the ledger) and counted in its
    #: project's estimate; unlisted types cost 0.
    local_step_credits: dict[str, Decimal] = {}

    @model_validator(mode="after")
    def _known_queues(self) -> WorkflowSettings:
        types = {t.value for t in StepType}
        vendor = {t.value for t, spec in STEP_SPECS.items() if spec.vendor}
        unknown_types = sorted(set(self.local_step_credits) - types)
        if unknown_types:
            raise ValueError(f"local_step_credits: unknown step type {', '.join(unknown_types)}")
        if priced := sorted(set(self.local_step_credits) & vendor):
            raise ValueError(f"local_step_credits: {', '.join(priced)} run as generation tasks, priced by the model")
        if any(c < 0 for c in self.local_step_credits.values()):
            raise ValueError("local_step_credits: a price cannot be negative")
        known = {q.value for q in QueueName}
        unknown = sorted(set(self.queue_max_running) - known)
        if unknown:
            listed = ", ".join(sorted(known))
            raise ValueError(f"queue_max_running: unknown queue {', '.join(unknown)} (known: {listed})")
        if any(n < 1 for n in self.queue_max_running.values()):
            raise ValueError("queue_max_running: every cap must be at least 1")
        if any(not r > 0 for r in self.provider_steps_per_s.values()):
            raise ValueError("provider_steps_per_s: every rate must be above 0")
        return self


class LoggingSettings(_Section):
    #: least severe log level written.
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    #: json: one JSON object per line (for collectors); console: for people.
    format: Literal["json", "console"] = "console"
    #: one INFO line per HTTP request from the API (path with signed query strings redacted, trace_id bound).
    access_log: bool = True


class MetricsSettings(_Section):
    """`GET /metrics`: database-derived gauges are read at scrape time."""

    #: serve `GET /metrics`.
    enabled: bool = True
    #: statement timeout of the scrape's queries (PostgreSQL); a slow database yields aivedio_metrics_db_up 0.
    query_timeout_ms: int = Field(2000, ge=100)
    #: window of the rate-like gauges (submission rate, state transition conflicts, callback lag).
    window_s: float = Field(300, gt=0)
    #: scrapes within this many seconds of the last one get the same answer (one query set, whoever asks).
    cache_s: float = Field(5, ge=0)


class AlertSettings(_Section):
    """Alert rules, evaluated by the sweeper over live data."""

    #: evaluate the alert rules.
    enabled: bool = True
    #: evaluate at most this often (s), however often the sweeper runs.
    interval_s: float = Field(60, gt=0)
    #: failed tasks and the media failure rate are counted over this window (s).
    window_s: float = Field(3600, gt=0)
    #: failed_tasks_high: tasks (and System B steps) failed within window_s, at least.
    failed_tasks: int = Field(20, ge=1)
    #: a provider failing this many tasks in a row raises an alert.
    provider_consecutive_failures: int = Field(5, ge=1)
    #: queue_backlog: due messages or steps in one queue, at least.
    queue_depth: int = Field(500, ge=1)
    #: queue_backlog: the oldest due message or step waited this long (s).
    queue_age_s: float = Field(900, gt=0)
    #: composition_failure_rate: share of failed media runs within window_s, at least.
    media_failure_rate: float = Field(0.2, gt=0, le=1)
    #: composition_failure_rate: media runs within window_s before the rate counts.
    media_min_samples: int = Field(10, ge=1)
    #: a tenant/project spending more than cost_factor × its hourly mean of the previous day, and at least
    #: cost_min_per_hour, in the last hour; or more than cost_budget_per_hour (0: no budget).
    cost_factor: float = Field(5, gt=1)
    cost_min_per_hour: Decimal = Field(Decimal("100"), ge=0)
    cost_budget_per_hour: Decimal = Field(Decimal("0"), ge=0)
    #: fs object store / data dir: alert below this many free bytes or this free fraction.
    min_free_bytes: int = Field(1024**3, ge=0)
    min_free_ratio: float = Field(0.05, ge=0, lt=1)
    #: role_missing: a required role (relay, worker, scheduler, sweeper) not seen alive this long (s) while work
    #: waits for it.
    role_missing_s: float = Field(120, gt=0)
    #: callback_verify_failures: a provider's callbacks failing verification (bad signature or token, stale
    #: timestamp, no secret configured, unreadable body) at least this many times in one window, alerted.
    callback_verify_failures: int = Field(20, ge=1)
    #: the fixed windows (s) failed callback verifications are counted in (`callback_rejections`).
    callback_verify_window_s: float = Field(300, ge=1)


class LivenessSettings(_Section):
    """Heartbeats: every role process writes its row (`process_heartbeats`) this often; `aivedio status` reads it."""

    #: seconds between two heartbeats of one process.
    heartbeat_interval_s: float = Field(5, gt=0)
    #: a process not seen this long (s) is shown as stale (likely dead); keep it a few intervals long.
    stale_after_s: float = Field(30, gt=0)
    #: `aivedio status` also lists stopped and stale processes seen within this many seconds; older rows are pruned
    #: after 7 days.
    history_s: float = Field(3600, gt=0)


def _default_providers() -> dict[str, ProviderSettings]:
    return {
        "local": ProviderSettings(
            adapter="local",
            allow_http_origin=True,
            output_hosts=["127.0.0.1"],
            models={
                "local-v1": ModelSettings(
                    max_duration_s=10,
                    resolutions=["360p", "720p"],
                    price_per_second={"360p": Decimal("0.5"), "720p": Decimal("1")},
                    max_outputs=4,
                )
            },
        )
    }


class Settings(BaseSettings):
    """Effective settings of one process."""

    model_config = SettingsConfigDict(
        env_prefix="AIVEDIO_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        # the file path is chosen at load time; see load_settings()
        toml_file=None,
    )

    #: embedded: one process, SQLite, in-process broker; distributed: PostgreSQL + Redis.
    mode: Literal["embedded", "distributed"] = "embedded"
    #: where embedded mode keeps its database, objects and keys.
    data_dir: Path = Path(".aivedio")
    #: provider used when a request names none.
    default_provider: str = "local"

    database: DatabaseSettings = DatabaseSettings()
    broker: BrokerSettings = BrokerSettings()
    redis: RedisSettings = RedisSettings()
    storage: StorageSettings = StorageSettings()
    api: ApiSettings = ApiSettings()
    limits: LimitsSettings = LimitsSettings()
    #: one table per provider, under a name of your choice ([providers.<name>]); by default only `local`.
    providers: dict[str, ProviderSettings] = Field(default_factory=_default_providers)
    retry: RetrySettings = RetrySettings()
    reconcile: ReconcileSettings = ReconcileSettings()
    webhooks: WebhookSettings = WebhookSettings()
    client_webhooks: ClientWebhookSettings = ClientWebhookSettings()
    fetch: FetchSettings = FetchSettings()
    media: MediaSettings = MediaSettings()
    moderation: ModerationSettings = ModerationSettings()
    review: ReviewSettings = ReviewSettings()
    polling: PollingSettings = PollingSettings()
    sweeper: SweeperSettings = SweeperSettings()
    workflows: WorkflowSettings = WorkflowSettings()
    retention: RetentionSettings = RetentionSettings()
    logging: LoggingSettings = LoggingSettings()
    metrics: MetricsSettings = MetricsSettings()
    alerts: AlertSettings = AlertSettings()
    liveness: LivenessSettings = LivenessSettings()

    @model_validator(mode="after")
    def _coherent(self) -> Settings:
        if self.default_provider not in self.providers:
            # messages of whole-model checks start with the key they are about (see _one_line)
            raise ValueError(f"default_provider: {self.default_provider!r} is not a configured provider")
        if self.mode == "distributed" and not self.is_postgres:
            raise ValueError("database.url: distributed mode needs a PostgreSQL URL")
        self._send_bound_below_grace()
        return self

    def _send_bound_below_grace(self) -> None:
        """A request may leave up to `send_deadline_s` after its claim and take the provider's HTTP timeouts to
        land; the sweeper must not call the attempt ambiguous before that, or a lookup can miss a job still on
        its way."""
        from aivedio_engine.providers.registry import send_timeout_s  # adapters import this module

        deadline, grace = self.retry.submit.send_deadline_s, self.sweeper.idle_grace_s
        for name, provider in self.providers.items():
            timeout = send_timeout_s(provider.adapter)
            if provider.enabled and deadline + timeout >= grace:
                raise ValueError(
                    f"retry.submit.send_deadline_s ({deadline:g}) + providers.{name}'s HTTP timeouts ({timeout:g}) "
                    f"must stay below sweeper.idle_grace_s ({grace:g})"
                )

    @property
    def database_url(self) -> str:
        return self.database.url or f"sqlite:///{(self.data_dir / 'aivedio.db').as_posix()}"

    @property
    def is_postgres(self) -> bool:
        return self.database_url.startswith("postgresql")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        if isinstance(env_settings, EnvSettingsSource):  # `X_FILE` names a file: _FileEnvSource reads it, not this
            env_settings.env_vars = {
                k: v for k, v in env_settings.env_vars.items() if not k.upper().endswith(FILE_ENV_SUFFIX)
            }
        return (init_settings, env_settings, _FileEnvSource(settings_cls), TomlConfigSettingsSource(settings_cls))


#: `AIVEDIO_<KEY>_FILE=/run/secrets/x` sets `<KEY>` to that file's content (a secret mount), for any setting
FILE_ENV_SUFFIX = "_FILE"


class _FileEnvSource(PydanticBaseSettingsSource):
    """Settings read from files named by `AIVEDIO_..._FILE` variables (Docker/Kubernetes secret mounts), so a
    provider's API key need not sit in the environment. The trailing newline of the file is dropped. Setting both
    `X` and `X_FILE` is refused: which one wins would be a guess."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, path in os.environ.items():
            upper = name.upper()
            if not (upper.startswith("AIVEDIO_") and upper.endswith(FILE_ENV_SUFFIX)):
                continue
            target = name[: -len(FILE_ENV_SUFFIX)]
            if target in os.environ:
                raise ConfigError(f"both {target} and {name} are set: keep one")
            try:
                value = Path(path).read_text(encoding="utf-8").removesuffix("\n").removesuffix("\r")
            except OSError as exc:
                raise ConfigError(f"{name}: cannot read {path}: {exc.strerror or exc}") from None
            except UnicodeDecodeError:
                raise ConfigError(f"{name}: {path} is not UTF-8 text") from None
            parts = target[len("AIVEDIO_") :].lower().split("__")
            if parts[0] not in self.settings_cls.model_fields:
                continue  # not a setting (e.g. the CLI client's own AIVEDIO_API_KEY_FILE)
            node = out
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        return out


def load_settings(
    config_path: str | os.PathLike[str] | None = None, overrides: dict[str, Any] | None = None
) -> Settings:
    """Build the effective settings; raises ConfigError with one line naming the offending key."""
    path = resolve_config_path(config_path)
    if path is not None:
        try:
            tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {path}: invalid TOML: {exc}") from None

    class _FromFile(Settings):
        model_config = SettingsConfigDict(toml_file=path)

    try:
        return _FromFile(**(overrides or {}))
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, path, overrides or {})) from None


def _one_line(exc: ValidationError, path: Path | None, overrides: dict[str, Any]) -> str:
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"]]
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    if not loc:  # a whole-model check: its message names the key itself
        return f"invalid setting {err['msg'].removeprefix('Value error, ')}{more}"
    msg = err["msg"].removeprefix("Value error, ")
    return f"invalid setting {'.'.join(loc)}: {msg}{_source_of(loc, path, overrides)}{more}"


def _source_of(loc: list[str], path: Path | None, overrides: dict[str, Any]) -> str:
    """Name where the bad value came from, so the operator knows what to fix."""
    node: Any = overrides
    for part in loc:
        node = node.get(part) if isinstance(node, dict) else None
    if node is not None:
        return " (from the command line)"
    env_name = "AIVEDIO_" + "__".join(loc).upper()
    if any(name.upper() == env_name for name in os.environ):
        return f" (from environment variable {env_name})"
    return f" (config file {path})" if path else ""


def masked_dump(settings: Settings) -> dict[str, Any]:
    """Settings as plain JSON-able data with every secret shown as '**********' (or '' when unset)."""
    return mask_secrets(settings.model_dump(mode="python"))


def mask_secrets(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return "**********" if value.get_secret_value() else ""
    if isinstance(value, dict):
        return {k: mask_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_secrets(v) for v in value]
    if isinstance(value, Path):
        return value.as_posix()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, str):
        return _URL_PASSWORD.sub(r"\1**********@", value)
    return value


#: the password part of `scheme://user:password@host` URLs (database, broker, redis).
_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]+@")
