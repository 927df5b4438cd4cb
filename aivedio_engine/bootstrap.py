"""The one composition root: turns Settings into the components a process needs.

Everything is built lazily and once per context, so a CLI command that only reads the database never
constructs a broker, an object store or an HTTP app. Front ends (API, CLI, TUI, worker actors) receive an
`AppContext` and call its services; nothing else wires components together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar, overload

from aivedio_engine.clock import Clock, SystemClock
from aivedio_engine.config import Settings

if TYPE_CHECKING:
    from aivedio_engine.db.async_pool import LoopPool
    from aivedio_engine.db.creation_batch import CreateBatcher
    from aivedio_engine.db.handles import Engine
    from aivedio_engine.domain.requests import Catalog
    from aivedio_engine.notify import Notifier
    from aivedio_engine.observability.alert_rules import AlertEvaluator
    from aivedio_engine.providers.registry import ProviderRegistry
    from aivedio_engine.ratelimit import BucketStore
    from aivedio_engine.services.alert_ops import AlertOps
    from aivedio_engine.services.assets import AssetService
    from aivedio_engine.services.callbacks import CallbackService
    from aivedio_engine.services.capacity_live import CapacityLiveService
    from aivedio_engine.services.dispatch import Dispatcher
    from aivedio_engine.services.doctor import Doctor
    from aivedio_engine.services.generations import GenerationService
    from aivedio_engine.services.invariants import InvariantService
    from aivedio_engine.services.keep_moving import KeepMoving
    from aivedio_engine.services.ledger_ops import LedgerOps
    from aivedio_engine.services.liveness import HeartbeatWriter, LivenessService
    from aivedio_engine.services.loop_create import LoopCreate
    from aivedio_engine.services.media import MediaService
    from aivedio_engine.services.output_fetch import OutputFetchService
    from aivedio_engine.services.outputs import OutputService
    from aivedio_engine.services.overview import OverviewService
    from aivedio_engine.services.player import PlayerService
    from aivedio_engine.services.project_ops import ProjectOps
    from aivedio_engine.services.quarantine import QuarantineSweeper
    from aivedio_engine.services.rate_limits import RequestRateLimiter, TenantLimitCache
    from aivedio_engine.services.reconcile_ops import ReconcileOps
    from aivedio_engine.services.replay import ReplayService
    from aivedio_engine.services.retention import RetentionService
    from aivedio_engine.services.review import ReviewService
    from aivedio_engine.services.storage_gc import StorageCollector
    from aivedio_engine.services.storage_scan import StorageScanner
    from aivedio_engine.services.stream_slots import StreamSlots
    from aivedio_engine.services.submit import SubmitService
    from aivedio_engine.services.sweeper import Sweeper
    from aivedio_engine.services.sync import ProviderSync
    from aivedio_engine.services.task_ops import TaskOps
    from aivedio_engine.services.tenant_purge import TenantPurger
    from aivedio_engine.services.tenants import TenantService
    from aivedio_engine.services.webhook_delivery import WebhookDeliverer
    from aivedio_engine.services.webhooks import WebhookService
    from aivedio_engine.services.workflows import WorkflowService
    from aivedio_engine.slots.base import SlotStore
    from aivedio_engine.storage.base import ObjectStore
    from aivedio_engine.storage.signing import UrlSigner
    from aivedio_engine.workflows.runner import WorkflowRunner

_T = TypeVar("_T")


class shared_property(cached_property[_T]):  # noqa: N801 - a decorator
    """`cached_property` that builds once even when threads race for it (Python 3.12 dropped its lock):
    two provider registries or engines would each hold half of the process's state."""

    _lock = threading.RLock()  # reentrant: building one component builds the ones it needs

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, instance: object, owner: type | None = None) -> _T: ...
    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None or self.attrname in instance.__dict__:
            return super().__get__(instance, owner)
        with self._lock:
            return super().__get__(instance, owner)


@dataclass
class AppContext:
    settings: Settings
    clock: Clock = field(default_factory=SystemClock)
    #: set after a commit that wrote outbox rows (embedded mode); relays wait on it.
    outbox_wakeup: threading.Event = field(default_factory=threading.Event)
    #: set after a commit that made a task ready or freed a slot (embedded mode); the dispatcher waits on it.
    dispatch_wakeup: threading.Event = field(default_factory=threading.Event)
    #: the broker queues this process's worker consumes (None: all); set by `worker.runtime` before any actor
    #: runs. A fetch goes straight on to the media step only where the media queue is consumed too, so a
    #: deployment that keeps media on its own workers keeps it there.
    worker_queues: frozenset[str] | None = None

    @shared_property
    def engine(self) -> Engine:
        from aivedio_engine.db import wakeup
        from aivedio_engine.db.engine import make_engine

        engine = make_engine(self.settings)
        if not self.settings.is_postgres:
            wakeup.install_commit_hooks(
                engine, wakeup.wake_events({wakeup.OUTBOX: self.outbox_wakeup, wakeup.DISPATCH: self.dispatch_wakeup})
            )
        return engine

    @shared_property
    def catalog(self) -> Catalog:
        from aivedio_engine.services.catalog import build_catalog

        return build_catalog(self.settings)

    @shared_property
    def tenants(self) -> TenantService:
        from aivedio_engine.services.tenants import TenantService

        return TenantService(self.engine, self.clock, self.settings)

    @shared_property
    def ledger_ops(self) -> LedgerOps:
        from aivedio_engine.services.ledger_ops import LedgerOps

        # provider → credits per unit of its invoice currency (ledger reconcile --apply)
        rates = {name: provider.invoice_credits_per_unit for name, provider in self.settings.providers.items()}
        return LedgerOps(self.engine, self.clock, rates)

    @shared_property
    def workflows(self) -> WorkflowService:
        from aivedio_engine.domain.ratelimit import Rate
        from aivedio_engine.domain.step_limits import StepLimits
        from aivedio_engine.services.workflows import WorkflowService

        wf = self.settings.workflows
        limits = StepLimits(
            project_image_steps=wf.project_max_image_steps,
            queue_running=dict(wf.queue_max_running),
            vendor_provider=self.settings.default_provider,
            provider_rate={p: Rate(per_s, max(1.0, per_s)) for p, per_s in wf.provider_steps_per_s.items()},
        )
        return WorkflowService(
            self.engine,
            self.clock,
            self.notifier,
            limits,
            wf.redrive_after_s,
            self.rate_buckets,
            catalog=self.catalog,
            local_step_credits=dict(wf.local_step_credits),
        )

    @shared_property
    def workflow_runner(self) -> WorkflowRunner:
        from aivedio_engine.workflows.runner import WorkflowRunner

        return WorkflowRunner(self)

    @shared_property
    def tenant_limits(self) -> TenantLimitCache:
        from aivedio_engine.services.rate_limits import TenantLimitCache

        return TenantLimitCache(self.tenants, self.clock, self.settings.api.auth_cache_ttl_s)

    @shared_property
    def rate_buckets(self) -> BucketStore:
        from aivedio_engine.ratelimit import build_bucket_store

        return build_bucket_store(self.settings)

    @shared_property
    def rate_limiter(self) -> RequestRateLimiter:
        from aivedio_engine.services.rate_limits import RequestRateLimiter

        return RequestRateLimiter(self.tenant_limits, self.rate_buckets, self.clock)

    @shared_property
    def stream_slots(self) -> StreamSlots:
        from aivedio_engine.services.stream_slots import StreamSlots

        api = self.settings.api
        return StreamSlots(api.sse_max_streams, api.sse_max_streams_per_tenant, api.sse_retry_after_s)

    @shared_property
    def generations(self) -> GenerationService:
        from aivedio_engine.services.generations import GenerationService

        return GenerationService(
            self.engine,
            self.clock,
            self.catalog,
            self.settings,
            tier_of=self.tenant_limits.tier,
            tier_cached=self.tenant_limits.cached_tier,
            batcher=self.create_batcher,
        )

    @shared_property
    def create_batcher(self) -> CreateBatcher | None:
        """The create route's statements on the event loop, several creates to one (PostgreSQL only)."""
        from aivedio_engine.db.creation_batch import CreateBatcher

        return CreateBatcher(self.engine) if self.settings.is_postgres else None

    @shared_property
    def loop_pool(self) -> LoopPool | None:
        """The API's async connections for the create route (PostgreSQL only); opened by the app's lifespan."""
        from aivedio_engine.db.async_pool import LoopPool

        return LoopPool(self.settings) if self.settings.is_postgres else None

    @shared_property
    def loop_create(self) -> LoopCreate:
        from aivedio_engine.services.loop_create import LoopCreate

        return LoopCreate(self.generations, self.rate_limiter, self.loop_pool)

    @shared_property
    def assets(self) -> AssetService:
        from aivedio_engine.services.assets import AssetService

        return AssetService(self.engine, self.clock, self.settings, self.storage)

    @shared_property
    def storage(self) -> ObjectStore:
        from aivedio_engine.storage import build_store

        return build_store(self.settings)

    @shared_property
    def providers(self) -> ProviderRegistry:
        from aivedio_engine.providers.registry import ProviderRegistry

        # the `local` adapter's jobs outlive the process (its rows in the engine's database), and it reports a
        # job's end as its callback (late-bound: the callback service is built on the registry)
        return ProviderRegistry(self.settings, self.engine, report=lambda name, obs: self.callbacks.report(name, obs))

    @shared_property
    def slots(self) -> SlotStore:
        from aivedio_engine.db.fences import fence_floor
        from aivedio_engine.slots import build_slot_store

        def floor() -> int:
            with self.engine.connect() as conn:
                return fence_floor(conn)

        return build_slot_store(self.settings, fence_floor=floor)

    @shared_property
    def submitter(self) -> SubmitService:
        from aivedio_engine.services.references import ReferenceResolver
        from aivedio_engine.services.submit import SubmitService

        references = ReferenceResolver(
            self.storage, self.settings.storage.reference_url_ttl_s, Path(self.settings.data_dir) / "reference-cache"
        )
        return SubmitService(
            self.engine,
            self.clock,
            self.settings,
            self.providers,
            callback_base=self.settings.api.public_base_url or None,
            references=references,
            slots=self.slots,
        )

    @shared_property
    def sync(self) -> ProviderSync:
        from aivedio_engine.services.sync import ProviderSync

        return ProviderSync(self.engine, self.clock, self.settings, self.providers, slots=self.slots)

    @shared_property
    def dispatcher(self) -> Dispatcher:
        from aivedio_engine.services.dispatch import Dispatcher

        return Dispatcher(self.engine, self.clock, self.settings, self.slots, rebuild_slots=self.rebuild_slots)

    def rebuild_slots(self) -> dict[str, int]:
        """Rebuild slot leases from the in-flight attempts (PostgreSQL/SQLite is the truth)."""
        from aivedio_engine.slots.reconcile import reconcile_slots

        report = reconcile_slots(self.engine, self.slots, ttl_s=self.settings.limits.slot_lease_ttl_s)
        return {
            "in_flight": report.in_flight,
            "kept": report.kept,
            "dropped": report.dropped,
            "added": len(report.added),
        }

    @shared_property
    def sweeper(self) -> Sweeper:
        from aivedio_engine.services.sweeper import Sweeper

        return Sweeper(
            self.engine,
            self.clock,
            self.settings,
            self.sync,
            self.keep_moving,
            self.rebuild_slots,
            upload_expirer=lambda: self.assets.expire_abandoned_uploads(
                older_than_s=self.settings.sweeper.abandoned_upload_s
            ),
            alert_evaluator=self.alert_evaluator,
            storage_scan=lambda: self.storage_scanner.scan_if_due(),
            storage_gc=lambda: self.storage_collector.collect_page_if_due(),
            quarantine=lambda: self.quarantine.sweep(),
            retention=lambda: self.retention.enforce_if_due(),
            review_sla=lambda: self.review.enforce_sla(),
        )

    @shared_property
    def keep_moving(self) -> KeepMoving:
        """Drives on what the stored facts say stopped (lost observations, attempts an ended task left open)."""
        from aivedio_engine.services.keep_moving import KeepMoving

        return KeepMoving(self.engine, self.clock, self.settings, self.slots, cancel_job=self.sync.cancel_job)

    @shared_property
    def quarantine(self) -> QuarantineSweeper:
        from aivedio_engine.services.quarantine import QuarantineSweeper

        return QuarantineSweeper(self.engine, self.clock, self.storage, self.settings)

    @shared_property
    def retention(self) -> RetentionService:
        from aivedio_engine.services.retention import RetentionService

        return RetentionService(self.engine, self.clock, self.storage, self.settings)

    @shared_property
    def tenant_purger(self) -> TenantPurger:
        from aivedio_engine.services.tenant_purge import TenantPurger

        return TenantPurger(self.engine, self.clock, self.storage)

    @shared_property
    def alert_evaluator(self) -> AlertEvaluator:
        from aivedio_engine.observability.alert_rules import AlertEvaluator

        return AlertEvaluator(self.engine, self.clock, self.settings, lambda: self.liveness)

    @shared_property
    def liveness(self) -> LivenessService:
        from aivedio_engine.services.liveness import LivenessService

        return LivenessService(self.engine, self.clock, self.settings)

    def heartbeat_writer(
        self, roles: frozenset[str], kind: str, activity: Callable[[], dict[str, str]]
    ) -> HeartbeatWriter:
        """A new heartbeat for one process running `roles` (not shared: each runtime is its own process row);
        after each beat it checks role_missing, so the rule holds even when the sweeper is the missing role."""
        from aivedio_engine.services.liveness import HeartbeatWriter

        evaluator = self.alert_evaluator
        return HeartbeatWriter(
            self.engine, self.clock, self.settings, roles, kind, activity, after_beat=evaluator.roles_if_due
        )

    @shared_property
    def doctor(self) -> Doctor:
        from aivedio_engine.services.doctor import Doctor

        return Doctor(self.settings, self.clock, lambda: self.engine, lambda: self.storage, lambda: self.liveness)

    @shared_property
    def storage_scanner(self) -> StorageScanner:
        from aivedio_engine.services.storage_scan import StorageScanner

        return StorageScanner(self.engine, self.clock, self.storage, self.settings)

    @shared_property
    def storage_collector(self) -> StorageCollector:
        from aivedio_engine.services.storage_gc import StorageCollector

        return StorageCollector(self.engine, self.clock, self.storage, self.settings, self.storage_scanner)

    @shared_property
    def callbacks(self) -> CallbackService:
        from aivedio_engine.services.callbacks import CallbackService

        return CallbackService(self.engine, self.clock, self.providers, self.settings.alerts)

    @shared_property
    def output_fetch(self) -> OutputFetchService:
        from aivedio_engine.domain.events import Queue
        from aivedio_engine.fetch.fetcher import Fetcher
        from aivedio_engine.services.inline_media import InlineMedia
        from aivedio_engine.services.output_fetch import OutputFetchService

        fetcher = Fetcher(self.settings.fetch, clock=self.clock)
        inline = None
        if self.worker_queues is None or Queue.MEDIA.value in self.worker_queues:
            inline = InlineMedia(self.engine, self.clock, self.media, self.settings.media.inline_after_fetch_max_bytes)
        return OutputFetchService(
            self.engine, self.clock, self.settings, self.providers, self.storage, fetcher, media=inline
        )

    @shared_property
    def url_signer(self) -> UrlSigner:
        """Signs the links our API verifies itself (HLS playlists, the player page)."""
        from aivedio_engine.storage.fs import load_signing_key
        from aivedio_engine.storage.signing import UrlSigner

        key = load_signing_key(self.settings.storage.signing_key.get_secret_value(), self.settings.data_dir)
        return UrlSigner(key, self.clock)

    @shared_property
    def outputs(self) -> OutputService:
        from aivedio_engine.services.outputs import OutputService

        return OutputService(self.engine, self.settings, self.storage, self.url_signer)

    @shared_property
    def player(self) -> PlayerService:
        from aivedio_engine.services.player import PlayerService

        return PlayerService(self.engine, self.settings, self.outputs, self.url_signer)

    @shared_property
    def media(self) -> MediaService:
        from aivedio_engine.services.media import MediaService

        return MediaService(self.engine, self.clock, self.settings, self.storage, self.catalog)

    @shared_property
    def webhooks(self) -> WebhookService:
        from aivedio_engine.services.webhooks import WebhookService

        return WebhookService(self.engine, self.clock, self.settings)

    @shared_property
    def webhook_deliverer(self) -> WebhookDeliverer:
        from aivedio_engine.services.webhook_delivery import WebhookDeliverer

        return WebhookDeliverer(self.engine, self.clock, self.settings)

    # operator use cases (CLI, TUI): nothing of their own to hold beyond the engine and the services they call
    @shared_property
    def task_ops(self) -> TaskOps:
        from aivedio_engine.services.task_ops import TaskOps

        return TaskOps(self.engine, self.clock)

    @shared_property
    def review(self) -> ReviewService:
        from aivedio_engine.services.review import ReviewService

        return ReviewService(self.engine, self.clock, self.settings, self.workflows)

    @shared_property
    def replay(self) -> ReplayService:
        from aivedio_engine.services.replay import ReplayService

        return ReplayService(self.engine, self.clock, self.settings)

    @shared_property
    def alert_ops(self) -> AlertOps:
        from aivedio_engine.services.alert_ops import AlertOps

        return AlertOps(self.engine, self.clock)

    @shared_property
    def project_ops(self) -> ProjectOps:
        from aivedio_engine.services.project_ops import ProjectOps

        return ProjectOps(self.engine, self.clock, self.workflows)

    @shared_property
    def overview(self) -> OverviewService:
        from aivedio_engine.services.overview import OverviewService

        return OverviewService(self.engine, self.clock, self.settings, self.liveness)

    @shared_property
    def reconcile_ops(self) -> ReconcileOps:
        from aivedio_engine.services.reconcile_ops import ReconcileOps

        return ReconcileOps(self.engine, self.clock, self.sync)

    @shared_property
    def capacity_live(self) -> CapacityLiveService:
        from aivedio_engine.services.capacity_live import CapacityLiveService

        return CapacityLiveService(self.engine, self.clock, self.settings)

    @shared_property
    def invariants(self) -> InvariantService:
        from aivedio_engine.services.invariants import InvariantService

        return InvariantService(self.engine, self.clock, self.settings)

    @shared_property
    def notifier(self) -> Notifier:
        from aivedio_engine.notify import build_notifier

        return build_notifier(self.settings)

    def close(self) -> None:
        if "notifier" in self.__dict__:
            self.notifier.close()
        if "providers" in self.__dict__:
            self.providers.close()
        if "engine" in self.__dict__:
            self.engine.dispose()


def build_context(settings: Settings, clock: Clock | None = None) -> AppContext:
    from aivedio_engine.media import isolation

    # process-wide, like the sandbox's set of live children: every media child of this process follows it
    isolation.configure(isolation.policy_from(settings.media.sandbox))
    return AppContext(settings=settings, clock=clock or SystemClock())
