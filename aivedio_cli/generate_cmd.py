"""`aivedio generate` (the main job) and `aivedio batch run`.

Without `--api-url` the engine runs inside this command (embedded: data dir, schema and a local tenant are made
on first use); with `--api-url` and `--api-key` the command is an HTTP client of a running `aivedio serve`.
Progress goes to stderr, so `--json` leaves exactly one JSON document on stdout.

Embedded, the engine runs only while a command hosts it (`generate --wait`, `generations wait`, `batch run`,
`serve`), and each of those resumes every unfinished task of the data dir. `generate` without `--wait` only
queues the task and says so in one line, as does `--wait` when it times out.

Ctrl-C stops following, never the work: the command submits nothing more, the embedded engine shuts down
gracefully (media work it stops is retried by the next engine that runs, nothing is marked failed), one line
says how to follow the task again, and the exit code is 130. A second Ctrl-C stops waiting for that shutdown.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from aivedio_cli._context import state
from aivedio_cli._params import complete_model, complete_provider, duration_option
from aivedio_cli._render import ExitCode, emit_json, fail
from aivedio_engine.domain.durations import format_seconds

if TYPE_CHECKING:  # Rich's progress and the engine load when a command runs, not when completion imports this
    from rich.console import Console

    from aivedio_engine.client import GenerationClient, Snapshot
    from aivedio_engine.jobs import BatchResult, StopFlag

batch_app = typer.Typer(help="Run many generations from a JSONL file.", no_args_is_help=True)

_API_URL = typer.Option(
    None, "--api-url", envvar="AIVEDIO_API_URL", help="Talk to a running server instead of running the engine here."
)
_API_KEY = typer.Option(None, "--api-key", envvar="AIVEDIO_API_KEY", help="API key for --api-url.")


def _err() -> Console:
    from rich.console import Console

    return Console(file=sys.stderr)


@contextmanager
def ctrl_c_stops(stop: StopFlag) -> Iterator[None]:
    """While the block runs, the first Ctrl-C only sets `stop`; a second one raises KeyboardInterrupt as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()  # a bool: safe whatever this thread was doing when the signal landed

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupted_line(text: str) -> None:
    # print, not Rich: one line whatever the terminal width, and no markup in it
    print(f"interrupted — {text}", file=sys.stderr, flush=True)


@contextmanager
def _client(
    ctx: typer.Context, api_url: str | None, api_key: str | None, *, host_engine: bool = True
) -> Iterator[GenerationClient]:
    """A client of the server at `api_url`, else of the data dir; `host_engine` runs the embedded engine for the
    duration of the block (without it, tasks are only queued: starting renders only to stop them is waste)."""
    from aivedio_engine.client import ClientError, EmbeddedClient, RemoteClient

    if api_url:
        if not api_key:
            fail("--api-url needs --api-key (or AIVEDIO_API_KEY)", ExitCode.USAGE)
        remote = RemoteClient(api_url, api_key)
        try:
            yield remote
        finally:
            remote.close()
        return
    from aivedio_engine import embedded
    from aivedio_engine.bootstrap import build_context
    from aivedio_engine.observability.logging import configure_logging

    # the engine runs here: its logs are masked too; WARNING unless configured, the terminal shows progress
    configure_logging(state(ctx).settings(), default_level="WARNING")
    app_ctx = build_context(state(ctx).settings())
    try:
        if host_engine:
            with embedded.running(app_ctx) as principal:
                yield EmbeddedClient(app_ctx, principal)
        else:
            yield EmbeddedClient(app_ctx, embedded.prepare(app_ctx))
    except (embedded.SchemaOutdated, ClientError) as exc:
        fail(str(exc))
    finally:
        app_ctx.close()


def generate(
    ctx: typer.Context,
    prompt: str = typer.Argument(..., help="What the video should show."),
    image: list[Path] = typer.Option([], "--image", help="Reference image (PNG/JPEG/WebP); repeatable."),
    video: list[Path] = typer.Option([], "--video", help="Reference video (MP4/WebM); repeatable."),
    model: str | None = typer.Option(
        None, "--model", autocompletion=complete_model, help="Model (default: the first one offered)."
    ),
    provider: str | None = typer.Option(
        None, "--provider", autocompletion=complete_provider, help="Provider (default: the model's default)."
    ),
    duration: int | None = typer.Option(None, "--duration", min=1, help="Length in seconds."),
    resolution: str | None = typer.Option(None, "--resolution", help="e.g. 720p."),
    priority: int | None = typer.Option(
        None, "--priority", min=1, max=5, help="Tier to be served in (1 first … 5); never better than your tenant's."
    ),
    n: int | None = typer.Option(
        None, "--n", min=1, max=4, help="Outputs (variants) to make, up to the model's max_outputs; costs × n."
    ),
    wait: bool = typer.Option(False, "--wait", help="Follow the task to its end and print the outputs."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    key: str | None = typer.Option(None, "--idempotency-key", help="Resubmitting with the same key is a no-op."),
    timeout: float = duration_option("15m", "--timeout", help="How long --wait waits before giving up"),
    api_url: str | None = _API_URL,
    api_key: str | None = _API_KEY,
) -> None:
    """Generate one video. Exit code 0 only when the task SUCCEEDED (or, without --wait, was accepted); 130 when
    Ctrl-C stopped the command first (the task continues)."""
    from aivedio_cli.generations_cmd import client_failed
    from aivedio_engine.client import ClientError
    from aivedio_engine.jobs import JobSpec, StopFlag, submit

    options = {
        k: v
        for k, v in {
            "model": model,
            "provider": provider,
            "duration_s": duration,
            "resolution": resolution,
            "priority": priority,
            "n": n,
        }.items()
        if v is not None
    }
    spec = JobSpec(prompt, tuple(image), tuple(video), options, key or f"cli:{uuid.uuid4()}")
    err = _err()
    stop = StopFlag()
    snap: Snapshot | None = None
    told = False

    def interrupted() -> bool:
        return stop.is_set() and (snap is None or (wait and not snap.finished))

    try:
        with ctrl_c_stops(stop), _client(ctx, api_url, api_key, host_engine=wait) as client:
            try:
                if not stop.is_set():
                    snap, resumed = submit(client, spec)
                    if not as_json:
                        err.print(f"task {snap.id} {'(already submitted) ' if resumed else ''}is {snap.status}")
                if wait and snap is not None and not stop.is_set():
                    snap = follow_with_progress(client, snap, err, timeout, stop)
            except ClientError as exc:
                client_failed(exc)  # a refused request (e.g. a duration the model does not offer) is a usage error
            if interrupted():  # say so now: the embedded engine's graceful shutdown may take a moment
                interrupted_line(_generate_interrupted_text(snap))
                told = True
    except KeyboardInterrupt:  # the second Ctrl-C, during submit or the engine's shutdown
        stop.set()
    if interrupted():
        if not told:
            interrupted_line(_generate_interrupted_text(snap))
        if as_json:
            emit_json(
                {
                    "id": snap and snap.id,
                    "status": snap.status if snap else "NOT_SUBMITTED",
                    "version": snap and snap.version,
                    "error": snap and snap.error,
                    "outputs": snap.outputs if snap else {},
                    "interrupted": True,
                }
            )
        raise typer.Exit(int(ExitCode.INTERRUPTED))
    assert snap is not None
    timed_out = timed_out_text(snap, timeout, remote=bool(api_url)) if wait and not snap.finished else None
    if as_json:
        doc = {"id": snap.id, "status": snap.status, "version": snap.version, "error": snap.error}
        doc["outputs"] = snap.outputs
        doc["variants"] = snap.variants
        if timed_out:
            doc |= {"error": timed_out, "error_type": "timeout"}
        emit_json(doc)
    elif not timed_out:
        _print_result(snap, err)
    if not wait and not snap.finished:
        print(_continue_line(snap, remote=bool(api_url)), file=sys.stderr, flush=True)
    if timed_out:
        fail(timed_out, ExitCode.FAILED, "timeout")
    if wait and snap.status != "SUCCEEDED":
        raise typer.Exit(int(ExitCode.FAILED))


def _continue_line(snap: Snapshot, *, remote: bool) -> str:
    """How a queued task goes on: embedded, nothing runs it once this command has ended."""
    return f"queued; {_how_it_continues(snap, remote=remote)}"


def _how_it_continues(snap: Snapshot, *, remote: bool) -> str:
    if remote:
        return f"the server runs it: follow it with `aivedio generations wait {snap.id}`"
    return f"it runs while an engine runs: `aivedio generations wait {snap.id}` or `aivedio serve`"


def timed_out_text(snap: Snapshot, timeout_s: float, *, remote: bool = False) -> str:
    """What `--wait` / `generations wait` say when the time is up: the task is not lost, only no longer followed."""
    return (
        f"timed out after {format_seconds(timeout_s)}: generation {snap.id} is still {snap.status}; "
        + _how_it_continues(snap, remote=remote)
    )


def _generate_interrupted_text(snap: Snapshot | None) -> str:
    if snap is None:
        return "nothing was submitted"
    return f"the task continues; follow it with `aivedio generations wait {snap.id}`"


def follow_with_progress(
    client: GenerationClient, snap: Snapshot, err: Console, timeout: float, stop: StopFlag | None = None
) -> Snapshot:
    """The live display of `generate --wait` and `generations wait`: one line per state change, a progress bar,
    the time elapsed; ends at a terminal state, at `timeout` or when `stop` is set."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from aivedio_engine.jobs import follow

    with Progress(
        TextColumn("[bold]{task.fields[status]:<16}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as progress:
        bar = progress.add_task("generate", total=100, status=snap.status)
        seen: list[str] = []

        def changed(s: Snapshot) -> None:
            if not seen or seen[-1] != s.status:
                seen.append(s.status)
                progress.console.print(f"  {s.status}")
            progress.update(bar, completed=s.progress, status=s.status)

        return follow(client, snap, changed, timeout_s=timeout, stop=stop)


def _print_result(snap: Snapshot, err: Console) -> None:
    if snap.status == "SUCCEEDED":
        err.print(f"[green]SUCCEEDED[/green] {snap.id}")
        for profile, where in sorted(snap.outputs.items()):
            typer.echo(f"{profile}: {where}")
        for variant in snap.variants[1:]:  # a request for n outputs: the others
            for profile, where in sorted(variant["outputs"].items()):
                typer.echo(f"v{variant['index']} {profile}: {where}")
    elif snap.finished:
        err.print(f"[red]{snap.status}[/red] {snap.id}" + (f" ({snap.error})" if snap.error else ""))


@batch_app.command("run")
def batch_run(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help='JSONL: one {"prompt": ..., "images": [...], ...} per line.'),
    concurrency: int = typer.Option(4, "--concurrency", min=1, max=256, help="Generations in flight at once."),
    out: Path | None = typer.Option(None, "--out", help="Write one JSON result per line here."),
    timeout: float = duration_option("30m", "--timeout", help="How long to wait for each generation"),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    api_url: str | None = _API_URL,
    api_key: str | None = _API_KEY,
) -> None:
    """Run every line of FILE; a re-run resumes (same idempotency key per line). Exit 3 if some failed, 130 when
    Ctrl-C stopped the command first (the submitted tasks continue)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from aivedio_engine.client import ClientError
    from aivedio_engine.jobs import StopFlag, parse_batch, run_batch

    try:
        specs = parse_batch(file)
    except ClientError as exc:
        fail(str(exc), ExitCode.USAGE)
    err = _err()
    lock = threading.Lock()
    stop = StopFlag()
    results: list[BatchResult] = []
    told = False
    sink = open(out, "w", encoding="utf-8") if out else None  # noqa: SIM115 - closed below
    try:
        with ctrl_c_stops(stop), _client(ctx, api_url, api_key) as client:
            with Progress(
                TextColumn("batch"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[failed]}"),
                TimeElapsedColumn(),
                console=err,
            ) as progress:
                bar = progress.add_task("batch", total=len(specs), failed="")
                failed = [0]

                def done(result: BatchResult) -> None:
                    with lock:
                        failed[0] += not result.ok
                        progress.update(bar, advance=1, failed=f"{failed[0]} failed" if failed[0] else "")
                        if sink:
                            sink.write(json.dumps(result.as_dict(), sort_keys=True) + "\n")
                            sink.flush()

                results = run_batch(
                    client, specs, concurrency=concurrency, timeout_s=timeout, on_result=done, stop=stop
                )
            if any(r.interrupted for r in results):  # say so now: the engine's shutdown may take a moment
                interrupted_line(_batch_interrupted_text(results, file))
                told = True
    except KeyboardInterrupt:  # the second Ctrl-C, during the engine's shutdown
        stop.set()
    finally:
        if sink:
            sink.close()
    summary = _summary(results)
    if stop.is_set() and (summary["interrupted"] or len(results) < len(specs)):
        if not told:
            interrupted_line(_batch_interrupted_text(results, file))
        if as_json:
            emit_json(summary)
        raise typer.Exit(int(ExitCode.INTERRUPTED))
    if as_json:
        emit_json(summary)
    else:
        err.print(
            f"{summary['succeeded']} succeeded, {summary['failed']} failed, "
            f"{summary['resumed']} resumed of {summary['total']}"
        )
        for r in results:
            if not r.ok:
                err.print(f"  line {r.spec.line}: {r.as_dict()['status']} {r.error or ''}".rstrip())
    if summary["failed"]:
        raise typer.Exit(int(ExitCode.PARTIAL))


def _batch_interrupted_text(results: list[BatchResult], file: Path) -> str:
    submitted = sum(1 for r in results if r.interrupted and r.snapshot is not None)
    if results and not submitted:
        return f"nothing more was submitted; run `aivedio batch run {file}` again to submit the rest"
    count = f"the {submitted} unfinished task(s)" if results else "the submitted tasks"
    return (
        f"{count} continue; run `aivedio batch run {file}` again to follow them and submit the rest "
        "(nothing is submitted twice)"
    )


def _summary(results: list[Any]) -> dict[str, Any]:
    return {
        "total": len(results),
        "succeeded": sum(r.ok for r in results),
        "failed": sum(not r.ok and not r.interrupted for r in results),
        "interrupted": sum(r.interrupted for r in results),
        "resumed": sum(r.resumed for r in results),
        "results": [r.as_dict() for r in results],
    }
