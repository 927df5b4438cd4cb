"""`aivedio capacity estimate|live`: the capacity model, from assumptions or measured rates."""

from __future__ import annotations

import typer
from rich.table import Table

from aivedio_cli._params import duration_option
from aivedio_cli._render import ExitCode, emit_json, fail, out
from aivedio_cli._services import service_context
from aivedio_engine.domain.capacity import (
    UNITS,
    CapacityInputError,
    CapacityInputs,
    explain,
    fmt,
    overload_warning,
)
from aivedio_engine.domain.capacity import estimate as estimate_capacity
from aivedio_engine.domain.capacity_live import LiveReport, Saturation, fmt_duration, parse_window, pressure_warnings

app = typer.Typer(help="Capacity planning with Little's law.", no_args_is_help=True)


@app.command("estimate")
def estimate(
    arrival_rate: float = typer.Option(..., "--arrival-rate", help="λ: peak task arrival rate, tasks/s."),
    avg_duration: float = duration_option(..., "--avg-duration", help="W: average provider run time"),
    target_utilization: float = typer.Option(
        0.75, "--target-utilization", help="ρ: target utilization of provider slots, in (0, 1]."
    ),
    provider_slots: int | None = typer.Option(
        None, "--provider-slots", help="C: total provider concurrency. Without it, throughput and growth are unknown."
    ),
    success_rate: float = typer.Option(0.9, "--success-rate", help="Share of tasks that produce an output, 0..1."),
    output_mb: float = typer.Option(60.0, "--output-mb", help="Average output size, MB."),
    burst_factor: float = typer.Option(
        2.0, "--burst-factor", help="Fetch-link headroom for bursts and protocol overhead, >= 1."
    ),
    media_seconds: float = duration_option("45s", "--media-seconds", help="Media processing time per output"),
    vcpu_per_media_job: float = typer.Option(2.0, "--vcpu-per-media-job", help="vCPU per media job."),
    transitions_per_task: float = typer.Option(14.0, "--transitions-per-task", help="State transitions per task."),
    poll_interval: float = duration_option("10s", "--poll-interval", help="Provider status polling interval"),
    backlog: int = typer.Option(0, "--backlog", help="Tasks the poller must visit when the backlog builds up."),
    connections: int = typer.Option(0, "--connections", help="Concurrent SSE / WebSocket connections."),
    kb_per_connection: float = typer.Option(20.0, "--kb-per-connection", help="Gateway memory per connection, KB."),
    as_json: bool = typer.Option(False, "--json", help="Print the 13 figures as JSON."),
) -> None:
    """Estimate slots, polling, bandwidth, media CPU, DB writes and SSE memory at peak.

    The defaults describe the reference workload; change any of them."""
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
    table = Table(title="Capacity estimate")
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


@app.command("live")
def live(
    ctx: typer.Context,
    window: str = typer.Option("1h", "--window", help="Measure over the last 90s / 15m / 1h / 2d."),
    target_utilization: float = typer.Option(
        0.75, "--target-utilization", help="ρ: target utilization of provider slots, in (0, 1]."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print measurements, figures and slot pressure as JSON."),
) -> None:
    """The same model fed with rates measured in the database, plus slot headroom and time to saturation."""
    try:
        window_s = parse_window(window)
    except ValueError as exc:
        fail(f"--window: {exc}", ExitCode.USAGE)
    if not 0 < target_utilization <= 1:
        fail(f"--target-utilization must be in (0, 1], got {target_utilization}", ExitCode.USAGE)
    with service_context(ctx) as app_ctx:
        report = app_ctx.capacity_live.report(window_s, target_utilization=target_utilization)
    if as_json:
        emit_json(_live_json(report))
    else:
        _print_live(report, window)


def _saturation_json(s: Saturation) -> dict[str, object]:
    return {
        "slots": s.slots,
        "in_flight": s.in_flight,
        "arrival_rate": s.arrival_rate,
        "avg_duration": s.avg_duration,
        "utilization": s.utilization,
        "headroom_slots": s.headroom_slots,
        "headroom_rate": s.headroom_rate,
        "queue_growth_per_min": s.queue_growth_per_min,
        "time_to_saturation_s": s.time_to_saturation_s,
    }


def _live_json(r: LiveReport) -> dict[str, object]:
    m = r.measured
    return {
        "window_s": m.window_s,
        "measured": {
            "arrivals": m.arrivals,
            "arrival_rate": m.arrival_rate,
            "provider_seconds": m.provider_seconds,
            "provider_samples": m.provider_samples,
            "finished": m.finished,
            "succeeded": m.succeeded,
            "success_rate": m.success_rate,
            "output_bytes": m.output_bytes,
            "outputs": m.outputs,
            "media_seconds": m.media_seconds,
            "media_samples": m.media_samples,
            "transitions_per_task": m.transitions_per_task,
            "in_flight": m.in_flight,
            "backlog": m.backlog,
        },
        "assumed": list(r.assumed),
        "figures": None if r.estimate is None else r.estimate.figures(),
        "why_no_estimate": r.why_no_estimate,
        "platform": _saturation_json(r.platform),
        "providers": {name: _saturation_json(s) for name, s in r.providers.items()},
    }


def _opt(value: float | None, suffix: str = "") -> str:
    return "n/a" if value is None else f"{fmt(round(value, 4))}{suffix}"


def _time_to_saturation(s: Saturation) -> str:
    # no provider run measured: W is unknown, so is the answer — unless nothing arrives for this pool at all
    if s.time_to_saturation_s is None and (s.slots is None or (s.avg_duration is None and s.arrival_rate > 0)):
        return "unknown"
    return fmt_duration(s.time_to_saturation_s)


def _print_live(r: LiveReport, window: str) -> None:
    console, m = out(), r.measured
    measured = Table("measured", "value", "samples", title=f"Measured over the last {window}")
    measured.add_row("arrival rate λ", f"{_opt(m.arrival_rate)} tasks/s", str(m.arrivals))
    measured.add_row("provider time W (submit → success)", _opt(m.provider_seconds, " s"), str(m.provider_samples))
    measured.add_row("success rate", _opt(m.success_rate), str(m.finished))
    measured.add_row(
        "raw output size", _opt(None if m.output_bytes is None else m.output_bytes / 1e6, " MB"), str(m.outputs)
    )
    measured.add_row("media time (POST_PROCESSING → next)", _opt(m.media_seconds, " s"), str(m.media_samples))
    measured.add_row("transitions per finished task", _opt(m.transitions_per_task), str(m.finished))
    measured.add_row("slots in use now", str(m.in_flight), "")
    measured.add_row("waiting for a slot now", str(m.backlog), "")
    console.print(measured)
    slots = Table(
        "pool",
        "slots",
        "in flight",
        "headroom",
        "utilization",
        "spare rate",
        "queue growth",
        "time to saturation",
        title="Provider slots",
    )
    for name, s in [*r.providers.items(), ("platform (all)", r.platform)]:
        slots.add_row(
            name,
            _opt(s.slots),
            str(s.in_flight),
            _opt(s.headroom_slots),
            _opt(None if s.utilization is None else s.utilization * 100, "%"),
            _opt(s.headroom_rate, " tasks/s"),
            f"{fmt(s.queue_growth_per_min)} tasks/min",
            _time_to_saturation(s),
        )
    console.print(slots)
    for line in pressure_warnings(r):
        console.print(f"[bold yellow]warning:[/] {line}", highlight=False)
    if r.estimate is None or r.inputs is None:
        console.print(f"no model estimate: {r.why_no_estimate}", highlight=False)
        return
    table = Table(title="Capacity model on measured rates")
    table.add_column("figure", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("unit", no_wrap=True)
    table.add_column("how")
    for name, value, how in explain(r.estimate, r.inputs):
        table.add_row(name, fmt(value), UNITS[name], how)
    console.print(table)
    if r.assumed:
        console.print(
            f"assumed (not measured in the window, model defaults used): {', '.join(r.assumed)}", highlight=False
        )
    warning = overload_warning(r.estimate, r.inputs)
    if warning:
        console.print(f"[bold yellow]warning:[/] {warning}", highlight=False)
