"""The `fetch_pressure` row: output storage cut while creates go on ("lower new-generation
concurrency to leave bandwidth for outputs about to expire").

The product (`Dispatcher._pressure`): while at least `fetch.pressure_urgent_outputs` tasks wait in OUTPUT_FETCHING
with an output URL expiring within `fetch.urgent_within_s`, every admission limit is scaled by
`fetch.pressure_dispatch_fraction`. The row keeps those three at the product defaults (1, 900 s, 0.5) and sets up
what makes the effect visible: the sim's output URLs live 600 s (`--faults url_expire=600s`, inside the 900 s
window, far longer than the run), and the platform limit is 8 (the harness's 1024 would never bind at 2 creates/s).
With S3 cut, fetched outputs cannot be stored, so tasks pile up in OUTPUT_FETCHING with expiring URLs; the
dispatcher must then hold the attempts in flight at the lowered limit (4) while QUEUED tasks wait, fail nothing,
and every task must finish once the store is back. The attempts in flight are read as the dispatcher counts them
(`db.degraded.in_flight_counts`, the platform scope), the urgent outputs as it counts them (`urgent_fetches`)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from aivedio_engine.config import FetchSettings
from aivedio_engine.db import degraded as degraded_db
from aivedio_engine.domain.admission import PLATFORM_SCOPE
from aivedio_engine.domain.degraded import scale
from bench.degrade.rows import Outage, Row, _never_failed, some_succeeded

PLATFORM_LIMIT = 8
URL_LIFETIME_S = 600
#: attempts admitted before the pressure began finish within a job and its report; samples this long after the
#: cut (half the outage when that is shorter: `--quick`) are judged against the lowered limit
SETTLE_S = 10.0
_FETCH = FetchSettings()  # the product defaults: the row does not change them


def lowered_limit() -> int:
    return scale(PLATFORM_LIMIT, _FETCH.pressure_dispatch_fraction)


def _sample(o: Outage, into: list[dict[str, Any]]) -> None:
    now = datetime.now(UTC)
    try:
        into.append(
            {
                **o.db.statuses(),
                "t": round(time.time() - o.t_cut, 1),
                "urgent": degraded_db.urgent_fetches(o.db.engine, now + timedelta(seconds=_FETCH.urgent_within_s)),
                "in_flight": degraded_db.in_flight_counts(o.db.engine).get(PLATFORM_SCOPE, 0),
            }
        )
    except Exception as exc:  # noqa: BLE001 - a sample, not a check
        into.append({"error": str(exc)[:100]})


def _watch(o: Outage) -> None:
    _sample(o, o.samples)


def _recover_watch(o: Outage) -> None:
    _sample(o, o.recovery_samples)


def _judge(o: Outage) -> list[str]:
    cap = lowered_limit()
    pressed = [s for s in o.samples if int(s.get("urgent", 0)) >= _FETCH.pressure_urgent_outputs]
    settle = min(SETTLE_S, (o.t_restore - o.t_cut) / 2)
    settled = [s for s in pressed if float(s["t"]) >= settle]
    over = [s for s in settled if int(s["in_flight"]) > cap]
    binding = [s for s in settled if int(s["in_flight"]) == cap and int(s.get("QUEUED", 0)) > 0]
    lifted = [s for s in o.recovery_samples if int(s.get("urgent", 0)) < _FETCH.pressure_urgent_outputs]
    o.notes.update(
        platform_limit=PLATFORM_LIMIT,
        lowered_limit=cap,
        max_urgent=max((int(s.get("urgent", 0)) for s in o.samples), default=0),
        pressed_samples=len(pressed),
        max_in_flight_under_pressure=max((int(s["in_flight"]) for s in settled), default=0),
        samples_at_limit_with_queued=len(binding),
        max_queued=max((int(s.get("QUEUED", 0)) for s in o.samples), default=0),
        pressure_lifted_after_restore_s=(round(float(lifted[0]["t"]) - (o.t_restore - o.t_cut), 1) if lifted else None),
        max_in_flight_after_lift=max((int(s["in_flight"]) for s in lifted), default=0),
    )
    out = _never_failed(o)
    if not pressed:
        out.append("no output about to expire waited in OUTPUT_FETCHING: the pressure never began")
    elif not settled:
        out.append(f"the pressure never lasted {settle:g} s after the cut")
    if over:
        worst = max(int(s["in_flight"]) for s in over)
        out.append(f"{len(over)} sample(s) under pressure with {worst} attempts in flight, above the lowered {cap}")
    # the control: the lower limit came from the pressure, so it must go once no output waits (if work was queued)
    if any(int(s.get("QUEUED", 0)) > cap for s in lifted) and o.notes["max_in_flight_after_lift"] <= cap:
        out.append(f"the pressure lifted and QUEUED tasks waited, yet no more than {cap} attempts ever ran after")
    if settled and not binding:
        out.append(f"the lowered limit ({cap}) never held QUEUED tasks back: the pressure's effect was not seen")
    return out


ROW = Row(
    "fetch_pressure",
    "storage",
    "outputs near expiry wait: dispatch held at the lowered limit, QUEUED waits, none failed; all finish after",
    _watch,
    _judge,
    ready=some_succeeded,
    setup={
        "sim_faults": f"url_expire={URL_LIFETIME_S}s",
        "replace": {"platform_max_concurrency = 1024": f"platform_max_concurrency = {PLATFORM_LIMIT}"},
    },
    recover_watch=_recover_watch,
)
