"""Provider name → adapter instance, built from Settings. The only place that knows the adapter classes."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from aivedio_engine.config import ProviderSettings, Settings
from aivedio_engine.domain.references import ModelLimits
from aivedio_engine.httpclient import Timeouts
from aivedio_engine.providers.base import Observation, Provider

#: adapters whose callbacks carry a signed timestamp: they take `webhooks.tolerance_s` as their replay window
TIMESTAMPED_CALLBACKS = frozenset({"sim", "replicate", "fal"})

if TYPE_CHECKING:
    from aivedio_engine.db.handles import Engine

#: adapter name → "module:Class"
ADAPTERS: dict[str, str] = {
    "local": "aivedio_engine.providers.local:LocalProvider",
    "sim": "aivedio_engine.providers.sim.adapter:SimProvider",
    "runway": "aivedio_engine.providers.runway:RunwayProvider",
    "replicate": "aivedio_engine.providers.replicate:ReplicateProvider",
    "fal": "aivedio_engine.providers.fal:FalProvider",
    "kling": "aivedio_engine.providers.kling:KlingProvider",
}


class UnknownProvider(KeyError):
    pass


class ProviderRegistry(Mapping[str, Provider]):
    """Adapters are created on first use, so a process only builds the providers it talks to."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine | None = None,
        report: Callable[[str, Observation], object] | None = None,
    ) -> None:
        self._settings = settings
        #: the engine's database, where the `local` adapter keeps its jobs (none: they live in memory)
        self._engine = engine
        #: where an adapter running in this process reports a job's end itself (`local`; none: polls only)
        self._report = report
        self._built: dict[str, Provider] = {}
        # worker threads ask for the same provider at once; two instances of a stateful adapter (local keeps
        # its jobs in memory) would each know only half of the jobs
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> Provider:
        built = self._built.get(name)
        if built is not None:
            return built
        with self._lock:
            if name not in self._built:
                cfg = self._settings.providers.get(name)
                if cfg is None or not cfg.enabled:
                    raise UnknownProvider(name)
                self._built[name] = build_adapter(name, cfg, self._settings, self._engine, self._report)
            return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return (n for n, p in self._settings.providers.items() if p.enabled)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def close(self) -> None:
        for provider in self._built.values():
            close = getattr(provider, "close", None)
            if close is not None:
                close()
        self._built.clear()


def model_limits(cfg: ProviderSettings, model: str) -> ModelLimits:
    """What `model` accepts through this provider's adapter, without building the adapter (the catalog needs no
    HTTP client). Each adapter module answers with its module-level `model_limits(model)`, the same function its
    Capabilities are built from."""
    target = ADAPTERS.get(cfg.adapter)
    if target is None:  # building the adapter says so; the catalog keeps the most conservative shape meanwhile
        return ModelLimits()
    module = importlib.import_module(target.split(":")[0])
    limits: ModelLimits = module.model_limits(model)
    return limits


def send_timeout_s(adapter: str) -> float:
    """The longest one call through this adapter's HTTP client can take end to end (a pooled connection, connect,
    write the body, read the answer). 0 for an adapter that calls no vendor (local renders in-process) or one
    this build does not know (building it says so)."""
    target = ADAPTERS.get(adapter)
    if target is None or adapter == "local":
        return 0.0
    module = importlib.import_module(target.split(":")[0])
    timeouts: Timeouts = getattr(module, "HTTP_TIMEOUTS", Timeouts())  # vendor adapters: the client's defaults
    return timeouts.total


def build_adapter(
    name: str,
    cfg: ProviderSettings,
    settings: Settings,
    engine: Engine | None = None,
    report: Callable[[str, Observation], object] | None = None,
) -> Provider:
    target = ADAPTERS.get(cfg.adapter)
    if target is None:
        raise UnknownProvider(f"provider {name!r}: unknown adapter {cfg.adapter!r}")
    module_name, class_name = target.split(":")
    cls: Any = getattr(importlib.import_module(module_name), class_name)
    kwargs: dict[str, Any] = {}
    if cfg.adapter == "local":
        kwargs["data_dir"] = settings.data_dir
        if engine is not None:
            from aivedio_engine.db.local_jobs import LocalJobs

            kwargs["jobs"] = LocalJobs(engine, name)
        kwargs["report"] = report
    if cfg.adapter in TIMESTAMPED_CALLBACKS:
        kwargs["webhook_tolerance_s"] = settings.webhooks.tolerance_s
    return cls(name, cfg, **kwargs)
