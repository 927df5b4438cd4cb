"""The one composition root: turns Settings into the components a process needs.

Everything is built lazily and once per context, so a CLI command that only reads the database never
constructs a broker, an object store or an HTTP app. Front ends (API, CLI, TUI, worker actors) receive an
`AppContext` and call its services; nothing else wires components together.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aivedio_engine.clock import Clock, SystemClock
from aivedio_engine.config import Settings

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from aivedio_engine.domain.requests import Catalog
    from aivedio_engine.notify import Notifier
    from aivedio_engine.providers.registry import ProviderRegistry
    from aivedio_engine.services.assets import AssetService
    from aivedio_engine.services.callbacks import CallbackService
    from aivedio_engine.services.dispatch import Dispatcher
    from aivedio_engine.services.generations import GenerationService
    from aivedio_engine.services.media import MediaService
    from aivedio_engine.services.output_fetch import OutputFetchService
    from aivedio_engine.services.outputs import OutputService
    from aivedio_engine.services.storage_scan import StorageScanner
    from aivedio_engine.services.submit import SubmitService
    from aivedio_engine.services.sweeper import Sweeper
    from aivedio_engine.services.sync import ProviderSync
    from aivedio_engine.services.tenants import TenantService
    from aivedio_engine.slots.base import SlotStore
    from aivedio_engine.storage.base import ObjectStore


class shared_property(cached_property):  # noqa: N801 - a decorator
    """`cached_property` that builds once even when threads race for it (Python 3.12 dropped its lock):
    two provider registries or engines would each hold half of the process's state."""

    _lock = threading.RLock()  # reentrant: building one component builds the ones it needs

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
    def generations(self) -> GenerationService:
        from aivedio_engine.services.generations import GenerationService

        return GenerationService(self.engine, self.clock, self.catalog, self.settings)

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

        return ProviderRegistry(self.settings)

    @shared_property
    def slots(self) -> SlotStore:
        from aivedio_engine.slots import build_slot_store
        from aivedio_engine.slots.reconcile import fence_floor

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
        )

    @shared_property
    def sync(self) -> ProviderSync:
        from aivedio_engine.services.sync import ProviderSync

        return ProviderSync(self.engine, self.clock, self.settings, self.providers)

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
        from aivedio_engine.observability.alert_rules import AlertEvaluator
        from aivedio_engine.services.sweeper import Sweeper

        return Sweeper(
            self.engine,
            self.clock,
            self.settings,
            self.sync,
            self.rebuild_slots,
            upload_expirer=lambda: self.assets.expire_abandoned_uploads(
                older_than_s=self.settings.sweeper.abandoned_upload_s
            ),
            alert_evaluator=AlertEvaluator(self.engine, self.clock, self.settings),
            storage_scan=lambda: self.storage_scanner.scan_if_due(),
        )

    @shared_property
    def storage_scanner(self) -> StorageScanner:
        from aivedio_engine.services.storage_scan import StorageScanner

        return StorageScanner(self.engine, self.clock, self.storage, self.settings)

    @shared_property
    def callbacks(self) -> CallbackService:
        from aivedio_engine.services.callbacks import CallbackService

        return CallbackService(self.engine, self.clock, self.providers)

    @shared_property
    def output_fetch(self) -> OutputFetchService:
        from aivedio_engine.fetch.fetcher import Fetcher
        from aivedio_engine.services.output_fetch import OutputFetchService

        fetcher = Fetcher(self.settings.fetch, clock=self.clock)
        return OutputFetchService(self.engine, self.clock, self.settings, self.providers, self.storage, fetcher)

    @shared_property
    def outputs(self) -> OutputService:
        from aivedio_engine.services.outputs import OutputService
        from aivedio_engine.storage.fs import load_signing_key
        from aivedio_engine.storage.signing import UrlSigner

        key = load_signing_key(self.settings.storage.signing_key.get_secret_value(), self.settings.data_dir)
        return OutputService(self.engine, self.settings, self.storage, UrlSigner(key, self.clock))

    @shared_property
    def media(self) -> MediaService:
        from aivedio_engine.services.media import MediaService

        return MediaService(self.engine, self.clock, self.settings, self.storage, self.catalog)

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
    return AppContext(settings=settings, clock=clock or SystemClock())
