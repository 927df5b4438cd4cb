"""SSRF-safe output fetcher. Its pinned-IP requests go through `aivedio_engine.httpclient`, the one
module that imports httpx (so the HTTP library can be swapped in one place)."""

from aivedio_engine.fetch.fetcher import CHUNK_SIZE, Download, Fetcher, FetchError
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
