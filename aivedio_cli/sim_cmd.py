"""`aivedio sim-provider`: run the simulated video vendor in the foreground until Ctrl-C.

The simulator is standalone: it reads no aivedio config, so it can be started next to any engine (or none).
The HTTP stack loads only when the command runs.
"""

from __future__ import annotations

import typer

from aivedio_cli._params import duration_option
from aivedio_cli._render import ExitCode, fail


def sim_provider(
    port: int = typer.Option(..., "--port", min=1, max=65535, help="Listen port."),
    host: str = typer.Option("127.0.0.1", "--host", help="Listen address (loopback by default)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the fault dice: same seed and spec, same fault sequence."),
    faults: str = typer.Option(
        "",
        "--faults",
        metavar="SPEC",
        help="Seeded faults, e.g. 'ambiguous=0.2,5xx=0.1,429=0.05,latency=50ms..200ms,dup_cb=0.3,url_expire=1s'.",
    ),
    webhook_url: str | None = typer.Option(
        None, "--webhook-url", help="Send signed status callbacks here (a job's own callback_url wins)."
    ),
    webhook_secret: list[str] = typer.Option(
        [],
        "--webhook-secret",
        metavar="whsec_...",
        help="Standard Webhooks secret; repeat to send one signature per secret (key rotation).",
    ),
    no_lookup: bool = typer.Option(
        False, "--no-lookup", help="No lookup by request key (501) and no Idempotency-Key dedupe."
    ),
    listing: bool = typer.Option(
        False, "--list", help="Serve GET /v1/jobs?created_after=&created_before= (list-and-match reconciliation)."
    ),
    job_seconds: float = duration_option("2s", "--job-seconds", help="Time from submit to success"),
    max_concurrency: int | None = typer.Option(
        None, "--max-concurrency", min=1, help="Jobs running at once; the rest wait THROTTLED."
    ),
    output_url_ttl: float = duration_option("1h", "--output-url-ttl", help="Output URL lifetime"),
    bill_factor: float = typer.Option(
        1.0, "--bill-factor", min=0, help="Billed seconds = requested × this (< 1 under-bills, > 1 over-bills)."
    ),
    cost_per_second: float = typer.Option(
        0.05, "--cost-per-second", min=0, help="The sim's own `cost` per billed second, in its currency."
    ),
) -> None:
    """Run a simulated video-generation vendor with seeded faults and ground truth at /_sim/truth."""
    from aivedio_engine.providers.sim.faults import FaultSpecError, parse_faults

    if job_seconds < 0.01 or output_url_ttl < 1:
        fail("--job-seconds must be at least 0.01s and --output-url-ttl at least 1s", ExitCode.USAGE)

    try:
        fault_spec = parse_faults(faults)
    except FaultSpecError as exc:
        fail(f"--faults: {exc}", ExitCode.USAGE)
    for secret in webhook_secret:
        if not _valid_secret(secret):
            fail("--webhook-secret: expected whsec_ followed by base64 of at least 24 bytes", ExitCode.USAGE)

    from aivedio_engine.providers.sim.app import serve
    from aivedio_engine.providers.sim.server import RealClock, SimConfig, SimState

    state = SimState(
        SimConfig(
            seed=seed,
            faults=fault_spec,
            job_seconds=job_seconds,
            lookup=not no_lookup,
            listing=listing,
            max_concurrency=max_concurrency,
            webhook_url=webhook_url,
            webhook_secrets=tuple(webhook_secret),
            output_url_ttl_s=output_url_ttl,
            bill_factor=bill_factor,
            cost_per_second=cost_per_second,
        ),
        RealClock(),
    )
    typer.echo(
        f"sim-provider on http://{host}:{port} seed={seed} faults={fault_spec.to_spec() or 'none'} "
        f"lookup={'off' if no_lookup else 'on'} job_seconds={job_seconds:g}",
        err=True,
    )
    try:
        serve(state, host, port)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")


def _valid_secret(secret: str) -> bool:
    import base64
    import binascii

    if not secret.startswith("whsec_"):
        return False
    try:
        return len(base64.b64decode(secret.removeprefix("whsec_"), validate=True)) >= 24
    except (binascii.Error, ValueError):
        return False
