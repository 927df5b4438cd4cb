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
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from aivedio_engine.domain.retry import DEFAULT_BUDGETS, RetryBudget, Step
from aivedio_engine.domain.status import DerivativeProfile

DEFAULT_CONFIG_FILE = "aivedio.toml"
CONFIG_ENV_VAR = "AIVEDIO_CONFIG"


class ConfigError(Exception):
    """A configuration file or value is invalid; the message is one line naming the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseSettings(_Section):
    #: SQLAlchemy URL. Empty: a SQLite file `aivedio.db` in the data dir (embedded mode).
    url: str = ""
    pool_size: int = Field(10, ge=1, le=200)
    #: server-side statement timeout for the short transactions, in milliseconds (PostgreSQL only).
    statement_timeout_ms: int = Field(5000, ge=100)
    #: how long a request waits for a connection before answering 503.
    connect_timeout_s: float = Field(1.5, gt=0)


class BrokerSettings(_Section):
    #: "stub": Dramatiq StubBroker with in-process worker threads; "redis": RedisBroker.
    kind: Literal["stub", "redis", "rabbitmq"] = "stub"
    url: str = "redis://127.0.0.1:6379/0"
    #: Dramatiq consumer idle timeout; ≤ 100 ms keeps end-to-end latency low.
    consumer_idle_timeout_ms: int = Field(100, ge=10)
    worker_threads: int = Field(4, ge=1, le=64)


class RedisSettings(_Section):
    #: slots, rate limits and pub/sub in distributed mode; unused in embedded mode.
    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "aivedio:"


class StorageSettings(_Section):
    kind: Literal["fs", "s3"] = "fs"
    #: fs: directory of the local object store; empty means `<data_dir>/objects`.
    root: str = ""
    bucket: str = "aivedio"
    endpoint_url: str = ""
    region: str = "us-east-1"
    access_key_id: SecretStr = SecretStr("")
    secret_access_key: SecretStr = SecretStr("")
    #: HMAC key for the fs store's signed URLs. Empty: generated once and kept in the data dir.
    signing_key: SecretStr = SecretStr("")
    #: lifetime of upload targets (presigned POST / signed URL), ≤ 900 s.
    upload_url_ttl_s: int = Field(900, ge=10, le=900)
    playback_url_ttl_s: int = Field(3600, ge=10, le=86400)
    #: lifetime of the signed URLs through which a provider reads a task's reference images/videos
    reference_url_ttl_s: int = Field(3600, ge=60, le=86400)
    multipart_part_bytes: int = Field(8 * 1024 * 1024, ge=5 * 1024 * 1024)


class ApiSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    #: base URL that signed links point at; empty means http://host:port.
    public_base_url: str = ""
    max_body_bytes: int = Field(1024 * 1024, ge=1024)
    #: per-tenant request rate limit (requests per second, token bucket).
    tenant_rate_limit_per_s: float = Field(50.0, gt=0)
    max_upload_bytes: int = Field(2 * 1024 * 1024 * 1024, ge=1)
    #: seconds an API process trusts a key it has verified: a key revoked elsewhere is refused within this
    auth_cache_ttl_s: float = Field(5, ge=0, le=5)
    #: seconds between `: ping` comments on an idle event stream (keeps proxies from closing it).
    sse_heartbeat_s: float = Field(15, gt=0)


class ModelSettings(_Section):
    max_duration_s: int = Field(10, ge=1)
    resolutions: list[str] = ["720p"]
    #: price per output second, by resolution, in credits.
    price_per_second: dict[str, Decimal] = {"720p": Decimal("1")}

    @model_validator(mode="after")
    def _priced(self) -> ModelSettings:
        missing = [r for r in self.resolutions if r not in self.price_per_second]
        if not self.resolutions or missing:
            raise ValueError(f"every resolution needs a price_per_second entry (missing: {missing or 'all'})")
        return self


class ProviderSettings(_Section):
    enabled: bool = True
    #: adapter name: local, sim, runway, replicate, fal, kling.
    adapter: str = "local"
    base_url: str = ""
    api_key: SecretStr = SecretStr("")
    #: Standard Webhooks secrets; several are accepted during a rotation.
    webhook_secrets: list[SecretStr] = []
    #: hosts the output fetcher may download from (label-boundary match).
    output_hosts: list[str] = []
    #: allow plain http to the provider's own origin (only for local and sim).
    allow_http_origin: bool = False
    max_concurrency: int = Field(4, ge=1)
    models: dict[str, ModelSettings] = {}
    supports_lookup_by_request_key: bool = True
    #: seconds a provider output URL stays valid.
    output_url_ttl_s: int = Field(3600, ge=1)


class LimitsSettings(_Section):
    platform_max_concurrency: int = Field(64, ge=1)
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


class RetryBudgetSettings(_Section):
    """One step's retry budget (seed 000 §4.9.4)."""

    max_attempts: int = Field(ge=1, le=100)
    max_total_wait_s: float = Field(gt=0)
    deadline_s: float = Field(gt=0)
    base_delay_s: float = Field(gt=0)
    multiplier: float = Field(ge=1)
    max_delay_s: float = Field(gt=0)
    provider_switch_allowed: bool
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


class RetrySettings(_Section):
    submit: RetryBudgetSettings = Field(default_factory=lambda: _default_budget(Step.SUBMIT))
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

    def budget(self, step: Step) -> RetryBudget:
        return getattr(self, step.value).to_domain()


class ReconcileSettings(_Section):
    #: look the job up by request key this many seconds after the ambiguous submit.
    lookup_after_s: list[float] = [10, 60, 300]
    #: still unknown after this: park the task and raise an alert, never resubmit blindly.
    park_after_s: float = Field(900, gt=0)
    #: for a provider that cannot look jobs up: after the window, resubmit (with a cost-risk alert) instead of
    #: parking the task for a human. Off by default: a duplicate paid job is possible.
    resubmit_without_lookup: bool = False


class WebhookSettings(_Section):
    tolerance_s: int = Field(300, ge=1)
    max_body_bytes: int = Field(256 * 1024, ge=1024)
    dedup_retention_days: int = Field(7, ge=1)


class FetchSettings(_Section):
    max_redirects: int = Field(3, ge=0, le=10)
    connect_timeout_s: float = Field(5, gt=0)
    idle_timeout_s: float = Field(30, gt=0)
    total_timeout_s: float = Field(600, gt=0)
    min_bytes_per_s: int = Field(64 * 1024, ge=0)
    max_bytes: int = Field(2 * 1024 * 1024 * 1024, ge=1)
    #: a fetch whose output URL expires within this many seconds goes to the urgent fetch queue.
    urgent_within_s: float = Field(900, ge=0)


class MediaSettings(_Section):
    #: derivatives that must be READY before a task may succeed.
    required_profiles: list[DerivativeProfile] = [
        DerivativeProfile.PROXY_MP4,
        DerivativeProfile.HLS,
        DerivativeProfile.THUMBNAIL,
    ]
    optional_profiles: list[DerivativeProfile] = [DerivativeProfile.WAVEFORM]
    pipeline_version: int = Field(1, ge=1)
    max_pixels: int = Field(3840 * 2160, ge=1)
    min_fps: float = Field(1, gt=0)
    max_fps: float = Field(120, gt=0)
    max_streams: int = Field(4, ge=1)
    max_duration_s: float = Field(60, gt=0)
    timeout_s: float = Field(600, gt=0)
    memory_limit_bytes: int = Field(2 * 1024 * 1024 * 1024, ge=64 * 1024 * 1024)
    #: output moderation: a prompt containing one of these terms holds the output for a human.
    review_prompt_terms: list[str] = []


class PollingSettings(_Section):
    min_interval_s: float = Field(5, ge=1)
    max_interval_s: float = Field(60, ge=1)
    jitter: float = Field(0.2, ge=0, lt=1)
    provider_query_budget_per_s: float = Field(20, gt=0)


class SweeperSettings(_Section):
    interval_s: float = Field(10, gt=0)
    idle_grace_s: float = Field(60, gt=0)
    #: an output fetch or media step with no progress and no pending request this long is published again.
    data_plane_stuck_s: float = Field(900, gt=0)
    #: upload sessions whose URL expired this long ago without an upload are expired and cleaned up.
    abandoned_upload_s: float = Field(86_400, gt=0)
    #: the object store is listed for orphan objects when the newest storage_scans row is this old.
    storage_scan_interval_s: float = Field(3600, gt=0)
    #: an object younger than this is never an orphan: its fetch or media run may not have committed yet.
    storage_scan_grace_s: float = Field(3600, ge=0)


class LoggingSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["json", "console"] = "console"
    #: one INFO line per HTTP request from the API (path with signed query strings redacted, trace_id bound).
    access_log: bool = True


class MetricsSettings(_Section):
    """`GET /metrics` (seed 000 §4.10.7): database-derived gauges are read at scrape time."""

    enabled: bool = True
    #: statement timeout of the scrape's queries (PostgreSQL); a slow database yields aivedio_metrics_db_up 0.
    query_timeout_ms: int = Field(2000, ge=100)
    #: window of the rate-like gauges (submission rate, state transition conflicts, callback lag).
    window_s: float = Field(300, gt=0)
    #: scrapes within this many seconds of the last one get the same answer (one query set, whoever asks).
    cache_s: float = Field(5, ge=0)


class AlertSettings(_Section):
    """Alert rules of seed 004 §17, evaluated by the sweeper over live data."""

    enabled: bool = True
    #: evaluate at most this often (s), however often the sweeper runs.
    interval_s: float = Field(60, gt=0)
    #: failed tasks and the media failure rate are counted over this window (s).
    window_s: float = Field(3600, gt=0)
    failed_tasks: int = Field(20, ge=1)
    provider_consecutive_failures: int = Field(5, ge=1)
    queue_depth: int = Field(500, ge=1)
    queue_age_s: float = Field(900, gt=0)
    media_failure_rate: float = Field(0.2, gt=0, le=1)
    media_min_samples: int = Field(10, ge=1)
    #: a tenant/project spending more than cost_factor × its hourly mean of the previous day, and at least
    #: cost_min_per_hour, in the last hour; or more than cost_budget_per_hour (0: no budget).
    cost_factor: float = Field(5, gt=1)
    cost_min_per_hour: Decimal = Field(Decimal("100"), ge=0)
    cost_budget_per_hour: Decimal = Field(Decimal("0"), ge=0)
    #: fs object store / data dir: alert below this many free bytes or this free fraction.
    min_free_bytes: int = Field(1024**3, ge=0)
    min_free_ratio: float = Field(0.05, ge=0, lt=1)


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
    providers: dict[str, ProviderSettings] = Field(default_factory=_default_providers)
    retry: RetrySettings = RetrySettings()
    reconcile: ReconcileSettings = ReconcileSettings()
    webhooks: WebhookSettings = WebhookSettings()
    fetch: FetchSettings = FetchSettings()
    media: MediaSettings = MediaSettings()
    polling: PollingSettings = PollingSettings()
    sweeper: SweeperSettings = SweeperSettings()
    logging: LoggingSettings = LoggingSettings()
    metrics: MetricsSettings = MetricsSettings()
    alerts: AlertSettings = AlertSettings()

    @model_validator(mode="after")
    def _coherent(self) -> Settings:
        if self.default_provider not in self.providers:
            # messages of whole-model checks start with the key they are about (see _one_line)
            raise ValueError(f"default_provider: {self.default_provider!r} is not a configured provider")
        if self.mode == "distributed" and not self.is_postgres:
            raise ValueError("database.url: distributed mode needs a PostgreSQL URL")
        return self

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
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))


def resolve_config_path(explicit: str | os.PathLike[str] | None) -> Path | None:
    """The file to read: explicit > $AIVEDIO_CONFIG > ./aivedio.toml if present. Missing explicit files are errors."""
    chosen = explicit or os.environ.get(CONFIG_ENV_VAR)
    if chosen:
        path = Path(chosen)
        if not path.is_file():
            source = "--config" if explicit else CONFIG_ENV_VAR
            raise ConfigError(f"config file not found: {path} (from {source})")
        return path
    default = Path(DEFAULT_CONFIG_FILE)
    return default if default.is_file() else None


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
    return f"invalid setting {'.'.join(loc)}: {err['msg']}{_source_of(loc, path, overrides)}{more}"


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


def parse_override(item: str) -> dict[str, Any]:
    """`section.key=value` → nested dict for load_settings(overrides=...). Values stay strings; pydantic coerces."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"invalid --set {item!r}: expected KEY=VALUE, e.g. database.url=postgresql+psycopg://...")
    out: dict[str, Any] = {}
    node = out
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def merge_overrides(items: list[str]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for item in items:
        _deep_merge(merged, parse_override(item))
    return merged


def _deep_merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _deep_merge(into[k], v)
        else:
            into[k] = v


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
