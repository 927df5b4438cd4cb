"""The SSRF-safe output fetcher: `Fetcher(settings, resolver, clock).open(url, policy)`.

Every hop: parse + validate the URL (`policy.check_url`), resolve the name once with the injected resolver,
refuse the host if ANY answer is blocked, connect to the validated address (`_transport.open_pinned`, no second
lookup). Redirects are followed manually, at most `max_redirects`, each re-validated from scratch. The body is
streamed as raw chunks with a byte cap (Content-Length checked before reading, the running count while reading),
an idle timeout per read, a total wall-clock timeout and a minimum throughput per window. Errors carry a reason
code; their messages never contain a query string (`redact`).

Limitation: the total timeout and throughput are checked between reads, so a wall-clock overrun can exceed
`total_timeout_s` by at most one idle timeout.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from urllib.parse import urljoin

from aivedio_engine.clock import Clock, SystemClock
from aivedio_engine.config import FetchSettings
from aivedio_engine.fetch import _transport
from aivedio_engine.fetch.policy import FetchPolicy, IPAddress, PolicyError, Target, check_address, check_url
from aivedio_engine.fetch.resolver import ResolveError, Resolver, SystemResolver
from aivedio_engine.httpclient import PinnedFailure, PinnedResponse, PinnedTimeout

CHUNK_SIZE = 64 * 1024
_REDIRECTS = {301, 302, 303, 307, 308}


class FetchError(Exception):
    """reason: blocked_scheme, blocked_host, blocked_address, resolve_failed, connect_failed, too_many_redirects,
    too_large, timeout, too_slow, bad_encoding, http_status (then `status` is set)."""

    def __init__(self, reason: str, message: str, *, status: int | None = None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.status = status


class Download:
    """An open response: iterate `chunks()` once (or the object itself); always `close()` (or use `with`)."""

    def __init__(
        self,
        response: PinnedResponse,
        target: Target,
        fetcher: Fetcher,
        started: float,
        redirects: int,
    ) -> None:
        self._response = response
        self._fetcher = fetcher
        self._started = started
        self.target = target
        self.url = target.redacted  # loggable
        self.peer_ip: IPAddress = response.peer_ip
        self.redirects = redirects
        self.status = response.status
        self.content_type = response.header("content-type") or "application/octet-stream"
        length = response.header("content-length")
        self.content_length = int(length) if length and length.strip().isdigit() else None
        self.bytes_read = 0
        self._consumed = False

    def chunks(self) -> Iterator[bytes]:
        if self._consumed:
            raise RuntimeError("Download.chunks() may be iterated only once")
        self._consumed = True
        s = self._fetcher.settings
        window = self._fetcher.throughput_window_s
        window_start = self._fetcher.now()
        window_bytes = 0
        try:
            for chunk in self._response.iter_raw(CHUNK_SIZE):
                self.bytes_read += len(chunk)
                if self.bytes_read > s.max_bytes:
                    raise FetchError("too_large", f"body exceeds {s.max_bytes} bytes: {self.url}")
                now = self._fetcher.now()
                if now - self._started > s.total_timeout_s:
                    raise FetchError("timeout", f"total timeout {s.total_timeout_s}s exceeded: {self.url}")
                window_bytes += len(chunk)
                elapsed = now - window_start
                if elapsed >= window:
                    if s.min_bytes_per_s and window_bytes / elapsed < s.min_bytes_per_s:
                        raise FetchError(
                            "too_slow",
                            f"{window_bytes / elapsed:.0f} B/s is below {s.min_bytes_per_s} B/s: {self.url}",
                        )
                    window_start, window_bytes = now, 0
                if chunk:
                    yield chunk
        except PinnedTimeout:
            raise FetchError("timeout", f"idle timeout {s.idle_timeout_s}s exceeded: {self.url}") from None
        except PinnedFailure as exc:
            raise FetchError("connect_failed", f"{exc}: {self.url}") from None
        finally:
            self.close()
        if self.content_length is not None and self.bytes_read != self.content_length:
            raise FetchError("truncated", f"got {self.bytes_read} of {self.content_length} bytes: {self.url}")

    def __iter__(self) -> Iterator[bytes]:
        return self.chunks()

    def close(self) -> None:
        self._response.close()

    def __enter__(self) -> Download:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Fetcher:
    def __init__(
        self,
        settings: FetchSettings,
        resolver: Resolver | None = None,
        clock: Clock | None = None,
        *,
        throughput_window_s: float = 30.0,
        verify: bool | str = True,
    ) -> None:
        self.settings = settings
        self.resolver: Resolver = resolver or SystemResolver(settings.connect_timeout_s)
        self.clock: Clock = clock or SystemClock()
        self.throughput_window_s = throughput_window_s
        self._verify = verify

    def now(self) -> float:
        return self.clock.now().timestamp()

    def open(self, url: str, policy: FetchPolicy) -> Download:
        """Validate, connect and read the response headers of `url` (following ≤ max_redirects redirects)."""
        s = self.settings
        started = self.now()
        redirects = 0
        current = url
        while True:
            target = self._validate(current, policy)
            ip = self._resolve(target, policy)
            if self.now() - started > s.total_timeout_s:
                raise FetchError("timeout", f"total timeout {s.total_timeout_s}s exceeded: {target.redacted}")
            try:
                response = _transport.open_pinned(
                    target,
                    ip,
                    connect_timeout_s=s.connect_timeout_s,
                    idle_timeout_s=s.idle_timeout_s,
                    verify=self._verify,
                )
            except PinnedTimeout:
                raise FetchError("timeout", f"connect timeout: {target.redacted}") from None
            except PinnedFailure as exc:
                raise FetchError("connect_failed", f"{exc}: {target.redacted}") from None
            status = response.status
            if status in _REDIRECTS:
                location = response.header("location")
                response.close()
                if not location:
                    raise FetchError("http_status", f"{status} without Location: {target.redacted}", status=status)
                redirects += 1
                if redirects > s.max_redirects:
                    raise FetchError("too_many_redirects", f"more than {s.max_redirects} redirects: {target.redacted}")
                current = urljoin(target.url, location)
                continue
            try:
                if status != 200:
                    raise FetchError("http_status", f"HTTP {status}: {target.redacted}", status=status)
                encoding = (response.header("content-encoding") or "identity").strip().lower()
                if encoding != "identity":
                    raise FetchError("bad_encoding", f"Content-Encoding {encoding!r}: {target.redacted}")
                download = Download(response, target, self, started, redirects)
                if download.content_length is not None and download.content_length > s.max_bytes:
                    raise FetchError(
                        "too_large",
                        f"Content-Length {download.content_length} exceeds {s.max_bytes}: {target.redacted}",
                    )
            except BaseException:
                response.close()
                raise
            return download

    @staticmethod
    def _validate(url: str, policy: FetchPolicy) -> Target:
        try:
            return check_url(url, policy)
        except PolicyError as exc:
            raise FetchError(exc.reason, str(exc)) from None

    def _resolve(self, target: Target, policy: FetchPolicy) -> IPAddress:
        if target.ip is not None:
            addresses = [target.ip]
        else:
            try:
                addresses = self.resolver.resolve(target.host, target.port)
            except ResolveError as exc:
                raise FetchError("resolve_failed", f"{exc}: {target.redacted}") from None
            if not addresses:
                raise FetchError("resolve_failed", f"no address: {target.redacted}")
        try:
            for ip in addresses:  # every answer must pass: a mixed answer refuses the host
                check_address(ip, policy, target.host)
        except PolicyError as exc:
            raise FetchError(exc.reason, f"{exc}: {target.redacted}") from None
        return addresses[0]
