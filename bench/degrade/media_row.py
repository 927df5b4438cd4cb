"""The `media` row: the media cluster down under load ("keep the raw output; the user sees
'generated, processing'").

The system runs a worker of its own for the media queue (`DegradeSystem.setup["media_worker"]`; the other worker
consumes every queue but media, so a fetch never runs the media step inline); the row kills it outright and starts
a new one at the restore. While it is gone, fetched tasks must wait in POST_PROCESSING with their raw output kept
(the RAW_OUTPUT asset row PROCESSING — it turns READY once a media run has probed it — and its object in the
bucket with the recorded size), the API must show them as "generated, processing", none may fail and none may
succeed (nothing made their derivatives). The shared checks (nothing charged twice, all terminal) and "every task
SUCCEEDED" follow.

`media.succeed_with_proxy_only` stays at the product default (off): it decides only when a run leaves the proxy MP4
READY and another required derivative failed; with no media worker at all no run happens, so it cannot change
what this row sees."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import sqlalchemy as sa

from aivedio_engine.db.tables import assets, generation_tasks
from aivedio_engine.domain.status import GENERATED_PROCESSING
from bench.degrade.rows import Outage, Row, _never_failed, _statuses_sample, some_succeeded

#: a raw output kept: recorded (PROCESSING until the media run has probed it, READY after) and not given up
_KEPT = ("PROCESSING", "READY")


def _raw_missing(o: Outage) -> list[str]:
    """POST_PROCESSING tasks with no kept RAW_OUTPUT asset."""
    t, a = generation_tasks.c, assets.c
    kept = sa.select(a.task_id).where(a.kind == "RAW_OUTPUT", a.status.in_(_KEPT))
    q = sa.select(t.id).where(t.status == "POST_PROCESSING", t.id.not_in(kept))
    with o.db.engine.connect() as conn:
        return [str(i) for i in conn.execute(q).scalars()]


def _check_raw_stored(o: Outage) -> None:
    """Each waiting task's raw object, read from the bucket directly (not through the proxy), once per task: present
    with the size its asset row records. Misses go to `notes["_raw_not_stored"]`."""
    t, a = generation_tasks.c, assets.c
    q = (
        sa.select(a.task_id, a.bucket, a.object_key, a.size_bytes)
        .join(generation_tasks, t.id == a.task_id)
        .where(t.status == "POST_PROCESSING", a.kind == "RAW_OUTPUT", a.status.in_(_KEPT))
    )
    checked: set[str] = o.notes.setdefault("_raw_checked", set())
    missing: list[str] = o.notes.setdefault("_raw_not_stored", [])
    s3: Any = o.system.direct_s3()
    with o.db.engine.connect() as conn:
        rows = [r for r in conn.execute(q) if str(r.task_id) not in checked]
    for task_id, bucket, key, size in rows:
        checked.add(str(task_id))
        try:
            if int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"]) != int(size):
                missing.append(f"{task_id} (size differs)")
        except Exception:  # noqa: BLE001 - any miss is the finding
            missing.append(str(task_id))


def _watch(o: Outage) -> None:
    _statuses_sample(o)
    sample = o.samples[-1]
    sample["raw_missing"] = len(_raw_missing(o))
    _check_raw_stored(o)
    waiting = [i for i, s in o.db.task_status().items() if s == "POST_PROCESSING"]
    if waiting:
        o.notes.setdefault("_stages", []).append(_stage(o, waiting[-1]))


def _stage(o: Outage, task_id: str) -> str:
    """What the API tells the user about one task: "STATUS:stage", or what went wrong."""
    req = urllib.request.Request(  # noqa: S310 - loopback
        f"{o.system.api_url}/v1/generations/{task_id}", headers={"Authorization": f"Bearer {o.system.api_key}"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - loopback
            body = json.loads(r.read())
    except OSError as exc:
        return f"error {type(exc).__name__}: {exc}"[:120]
    return f"{body['status']}:{body['stage']}"


def _judge(o: Outage) -> list[str]:
    stages: list[str] = o.notes.pop("_stages", [])
    held = max((s.get("POST_PROCESSING", 0) for s in o.samples), default=0)
    want = f"POST_PROCESSING:{GENERATED_PROCESSING}"
    first_ok = o.samples[0].get("SUCCEEDED", 0) if o.samples else 0
    last_ok = max((s.get("SUCCEEDED", 0) for s in o.samples), default=0)
    not_stored: list[str] = o.notes.pop("_raw_not_stored", [])
    raw_checked = len(o.notes.pop("_raw_checked", set()))
    o.notes.update(
        max_post_processing=held,
        raw_objects_checked=raw_checked,
        max_raw_missing=max((s.get("raw_missing", 0) for s in o.samples), default=0),
        stage_reads=len(stages),
        stage_generated_processing=sum(1 for s in stages if s == want),
        succeeded_during_outage=last_ok - first_ok,
        media_restarts=o.system.media_restarts,
    )
    out = _never_failed(o)
    if held == 0:
        out.append("no task waited in POST_PROCESSING while the media worker was gone (did any fetch run?)")
    if o.notes["max_raw_missing"]:
        out.append(f"up to {o.notes['max_raw_missing']} POST_PROCESSING task(s) without a kept RAW_OUTPUT asset")
    if held and not raw_checked:
        out.append("no waiting task's raw object was read from the bucket")
    if not_stored:
        out.append(f"{len(not_stored)} waiting task(s) whose raw output is not in the bucket: {not_stored[:3]}")
    if not stages or o.notes["stage_generated_processing"] != len(stages):
        wrong = sorted({s for s in stages if s != want})
        out.append(f"the API showed {want} on {o.notes['stage_generated_processing']}/{len(stages)} reads ({wrong})")
    if last_ok > first_ok:
        out.append(f"{last_ok - first_ok} task(s) SUCCEEDED while no media worker ran")
    final = o.db.statuses()
    others = {s: n for s, n in final.items() if s != "SUCCEEDED"}
    if others:
        out.append(f"not every task SUCCEEDED after the media worker came back: {others}")
    return out


ROW = Row(
    "media",
    "media",
    "raw kept, POST_PROCESSING shown as 'generated, processing', none failed; all SUCCEEDED after",
    _watch,
    _judge,
    ready=some_succeeded,
    setup={"media_worker": True},
)
