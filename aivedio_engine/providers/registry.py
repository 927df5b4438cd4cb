"""Provider name → adapter instance, built from Settings. The only place that knows the adapter classes."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from aivedio_engine.config import ProviderSettings, Settings
from aivedio_engine.providers.base import Provider

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

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
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
                self._built[name] = build_adapter(name, cfg, self._settings)
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


def build_adapter(name: str, cfg: ProviderSettings, settings: Settings) -> Provider:
    target = ADAPTERS.get(cfg.adapter)
    if target is None:
        raise UnknownProvider(f"provider {name!r}: unknown adapter {cfg.adapter!r}")
    module_name, class_name = target.split(":")
    cls: Any = getattr(importlib.import_module(module_name), class_name)
    kwargs: dict[str, Any] = {}
    if cfg.adapter == "local":
        kwargs["data_dir"] = settings.data_dir
    return cls(name, cfg, **kwargs)
