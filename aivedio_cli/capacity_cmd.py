"""`aivedio capacity estimate`: the capacity model of seed 000 §4.10, from the command line."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from aivedio_cli._render import ExitCode, emit_json, fail, out
from aivedio_engine.domain.capacity import (
    UNITS,
    CapacityInputError,
    CapacityInputs,
    estimate as estimate_capacity,
    explain,
    fmt,
    overload_warning,
)

app = typer.Typer(help="Capacity planning with Little's law (seed 000 §4.10).", no_args_is_help=True)


@app.command("estimate")
def estimate(
    arrival_rate: float = typer.Option(..., "--arrival-rate", help="λ: peak task arrival rate, tasks/s."),
    avg_duration: float = typer.Option(..., "--avg-duration", help="W: average provider run time, seconds."),
    target_utilization: float = typer.Option(
        0.75, "--target-utilization", help="ρ: target utilization of provider slots, in (0, 1]."
    ),
    provider_slots: Optional[int] = typer.Option(
        None, "--provider-slots", help="C: total provider concurrency. Without it, throughput and growth are unknown."
    ),
    success_rate: float = typer.Option(0.9, "--success-rate", help="Share of tasks that produce an output, 0..1."),
    output_mb: float = typer.Option(60.0, "--output-mb", help="Average output size, MB."),
    burst_factor: float = typer.Option(
        2.0, "--burst-factor", help="Fetch-link headroom for bursts and protocol overhead, >= 1."
    ),
    media_seconds: float = typer.Option(45.0, "--media-seconds", help="Media processing time per output, seconds."),
    vcpu_per_media_job: float = typer.Option(2.0, "--vcpu-per-media-job", help="vCPU per media job."),
    transitions_per_task: float = typer.Option(14.0, "--transitions-per-task", help="State transitions per task."),
    poll_interval: float = typer.Option(10.0, "--poll-interval", help="Provider status polling interval, seconds."),
    backlog: int = typer.Option(0, "--backlog", help="Tasks the poller must visit when the backlog builds up."),
    connections: int = typer.Option(0, "--connections", help="Concurrent SSE / WebSocket connections."),
    kb_per_connection: float = typer.Option(20.0, "--kb-per-connection", help="Gateway memory per connection, KB."),
    as_json: bool = typer.Option(False, "--json", help="Print the 13 figures as JSON."),
) -> None:
    """Estimate slots, polling, bandwidth, media CPU, DB writes and SSE memory at peak (defaults: seed 000 §4.10)."""
    try:
        inputs = CapacityInputs(
            arrival_rate=arrival_rate,
            avg_duration=avg_duration,
            target_utilization=target_utilization,
            provider_slots=provider_slots,
            success_rate=success_rate,
            output_mb=output_mb,
            burst_factor=burst_factor,
            media_seconds=media_seconds,
            vcpu_per_media_job=vcpu_per_media_job,
            transitions_per_task=transitions_per_task,
            poll_interval=poll_interval,
            backlog=backlog,
            connections=connections,
            kb_per_connection=kb_per_connection,
        )
    except CapacityInputError as exc:
        option = "--" + exc.field.replace("_", "-")
        fail(f"{option} {exc.requirement}, got {exc.value}", ExitCode.USAGE)
    result = estimate_capacity(inputs)
    if as_json:
        emit_json(result.figures())
        return
    table = Table(title="Capacity estimate (seed 000 §4.10)")
    # Names and values must stay whole and greppable; only the explanation may wrap.
    table.add_column("figure", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("unit", no_wrap=True)
    table.add_column("how")
    for name, value, how in explain(result, inputs):
        table.add_row(name, fmt(value), UNITS[name], how)
    console = out()
    console.print(table)
    warning = overload_warning(result, inputs)
    if warning:
        console.print(f"[bold yellow]warning:[/] {warning}", highlight=False)
