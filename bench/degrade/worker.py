"""`python -m bench.degrade.worker FLAG_FILE <aivedio arguments>`: run `aivedio` (the worker role) with the output
fetcher's resolver replaced by `FlagResolver`, the harness's switch for the "DNS failing" row.

The fetcher resolves every host name through its injected resolver (`aivedio_engine/fetch/resolver.py`); the sim
publishes its outputs under `localhost`, so every output fetch asks it. While FLAG_FILE exists every lookup fails
as a SERVFAIL would; otherwise `localhost` is 127.0.0.1 (one answer, so the fetch connects where the sim listens)
and any other name goes to the system resolver. The product runs unchanged otherwise."""

from __future__ import annotations

import ipaddress
import os
import sys

from aivedio_engine.fetch.policy import IPAddress
from aivedio_engine.fetch.resolver import ResolveError, SystemResolver


class FlagResolver:
    def __init__(self, flag_file: str, timeout_s: float = 5.0) -> None:
        self.flag_file = flag_file
        self._system = SystemResolver(timeout_s)

    def resolve(self, host: str, port: int) -> list[IPAddress]:
        if os.path.exists(self.flag_file):
            raise ResolveError(f"{host}: SERVFAIL (degradation harness)")
        if host.lower() == "localhost":
            return [ipaddress.ip_address("127.0.0.1")]
        return self._system.resolve(host, port)


def main() -> None:
    flag, args = sys.argv[1], sys.argv[2:]
    from aivedio_engine.fetch import fetcher

    # Fetcher() builds `SystemResolver(timeout)` when none is injected: the name it calls
    fetcher.SystemResolver = lambda timeout_s=5.0: FlagResolver(flag, timeout_s)  # type: ignore[assignment,misc,return-value]
    from aivedio_cli.main import run

    sys.argv = ["aivedio", *args]
    run()


if __name__ == "__main__":
    main()
