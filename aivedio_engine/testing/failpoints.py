"""Named crash points: `failpoint("relay.after_enqueue")` is a no-op until a test enables it.

Enabled from the environment of a process (so chaos tests can arm subprocesses) or in-process:

    AIVEDIO_FAILPOINTS="relay.after_enqueue=kill@37;consume.before_commit=raise%0.1"
    AIVEDIO_FAILPOINTS_SEED=7                  # probabilities are drawn from a seeded RNG per failpoint
    AIVEDIO_FAILPOINTS_LOG=/tmp/hits.log       # every hit of an armed failpoint appends "pid name n\\n"

Actions: `count` (only record the hit), `raise` (FailpointError), `kill` (SIGKILL this process), `sleep:S`,
`crash` (FailpointCrash, a BaseException: no `except Exception` swallows it, every open transaction rolls back,
nothing after the point runs: the in-process stand-in for a death, used by tests/support/crash_matrix.py).

Commit boundaries are named `<step>.before_commit` (last statement inside the transaction) and
`<step>.after_commit` (first statement after it committed, before any after-commit work).
Modifiers: `@N` fires on the N-th hit only; `%P` fires with probability P. Entries are separated by `;`.

The hit log doubles as an honest counter across processes: it is written with one unbuffered O_APPEND write
*before* the action runs, so a hit that SIGKILLs the process is still counted.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

ENV_SPEC = "AIVEDIO_FAILPOINTS"
ENV_SEED = "AIVEDIO_FAILPOINTS_SEED"
ENV_LOG = "AIVEDIO_FAILPOINTS_LOG"

ACTIONS = ("count", "raise", "kill", "sleep", "crash")


class FailpointError(RuntimeError):
    """Raised by a failpoint armed with `raise`."""


class FailpointCrash(BaseException):
    """Raised by a failpoint armed with `crash`: the process is to be treated as dead from this point on."""


@dataclass
class _Point:
    name: str
    action: str
    arg: float = 0.0
    nth: int | None = None
    probability: float | None = None
    callback: Callable[[], None] | None = None
    hits: int = 0
    rng: random.Random = field(default_factory=random.Random)


_lock = threading.Lock()
_points: dict[str, _Point] = {}
_log_fd: int | None = None


def failpoint(name: str) -> None:
    """Run the action armed for `name`, if any. Cheap when nothing is armed: one dict lookup."""
    point = _points.get(name)
    if point is None:
        return
    with _lock:
        point.hits += 1
        hit = point.hits
        fire = _should_fire(point, hit)
    if _log_fd is not None:
        os.write(_log_fd, f"{os.getpid()} {name} {hit}\n".encode())
    if fire:
        _fire(point, hit)


def _should_fire(point: _Point, hit: int) -> bool:
    if point.nth is not None:
        return hit == point.nth
    if point.probability is not None:
        return point.rng.random() < point.probability
    return True


def _fire(point: _Point, hit: int) -> None:
    if point.callback is not None:
        point.callback()
    elif point.action == "raise":
        raise FailpointError(f"failpoint {point.name} fired (hit {hit})")
    elif point.action == "crash":
        raise FailpointCrash(f"failpoint {point.name} crashed the process (hit {hit})")
    elif point.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif point.action == "sleep":
        time.sleep(point.arg)


def parse(spec: str, seed: int | str = 0) -> dict[str, _Point]:
    """`name=action[@N|%P];...` → armed points; raises ValueError naming the bad entry."""
    points: dict[str, _Point] = {}
    for entry in (e.strip() for e in spec.replace("\n", ";").split(";")):
        if not entry:
            continue
        name, sep, rest = entry.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"failpoint entry {entry!r}: expected name=action")
        name, rest = name.strip(), rest.strip()
        nth = probability = None
        if "@" in rest:
            rest, _, n = rest.partition("@")
            nth = int(n)
            if nth < 1:
                raise ValueError(f"failpoint entry {entry!r}: @N counts from 1")
        elif "%" in rest:
            rest, _, p = rest.partition("%")
            probability = float(p)
            if not 0 <= probability <= 1:
                raise ValueError(f"failpoint entry {entry!r}: probability must be within [0, 1]")
        action, _, arg = rest.partition(":")
        if action not in ACTIONS:
            raise ValueError(f"failpoint entry {entry!r}: action must be one of {', '.join(ACTIONS)}")
        points[name] = _Point(
            name, action, float(arg) if arg else 0.0, nth, probability, rng=random.Random(f"{seed}:{name}")
        )
    return points


def configure(spec: str | None, *, seed: int | str = 0, log_path: str | None = None) -> None:
    """Replace every armed failpoint with `spec` (None or "" disarms all)."""
    global _log_fd
    points = parse(spec or "", seed)
    with _lock:
        if _log_fd is not None:
            os.close(_log_fd)
            _log_fd = None
        if log_path:
            _log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _points.clear()
        _points.update(points)


def enable(name: str, callback: Callable[[], None]) -> None:
    """In-process hook: call `callback` on every hit of `name` (tests use it to pause or count)."""
    with _lock:
        _points[name] = _Point(name, "count", callback=callback)


def hits(name: str) -> int:
    point = _points.get(name)
    return point.hits if point else 0


def reset() -> None:
    configure(None)


def configure_from_env() -> None:
    configure(os.environ.get(ENV_SPEC), seed=os.environ.get(ENV_SEED, "0"), log_path=os.environ.get(ENV_LOG))


configure_from_env()
