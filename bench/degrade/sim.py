"""`python -m bench.degrade.sim PUBLIC_URL <sim-provider arguments>`: the sim provider, publishing its output URLs
under PUBLIC_URL instead of the address it binds.

The harness puts a proxy in front of the sim and names it `localhost`: the engine's fetch policy allows plain http
only from the provider's own origin (host and port), so the outputs must be served where the API is, through the
same proxy, and under a name the fetcher resolves (the "DNS failing" row). Measurement set-up only; the sim runs
unchanged otherwise."""

from __future__ import annotations

import sys


def main() -> None:
    public, args = sys.argv[1], sys.argv[2:]
    from aivedio_engine.providers.sim import server

    # the sim sets base_url from its bound socket; every output URL is built from it
    server.SimState.base_url = property(lambda self: public, lambda self, value: None)  # type: ignore[assignment]
    from aivedio_cli.main import run

    sys.argv = ["aivedio", "sim-provider", *args]
    run()


if __name__ == "__main__":
    main()
