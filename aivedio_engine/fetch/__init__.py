"""SSRF-safe output fetcher (DESIGN §10). httpx is used only in `_transport` (the pinned-IP transport)."""

from aivedio_engine.fetch.fetcher import CHUNK_SIZE, Download, FetchError, Fetcher
from aivedio_engine.fetch.policy import FetchPolicy, PolicyError, Target, check_address, check_url, redact
from aivedio_engine.fetch.resolver import ResolveError, Resolver, StaticResolver, SystemResolver

__all__ = [
    "CHUNK_SIZE",
    "Download",
    "FetchError",
    "FetchPolicy",
    "Fetcher",
    "PolicyError",
    "ResolveError",
    "Resolver",
    "StaticResolver",
    "SystemResolver",
    "Target",
    "check_address",
    "check_url",
    "redact",
]
