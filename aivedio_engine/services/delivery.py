"""What a task delivered: the outputs of its job a client can play, which is what a success is charged for.

An output is delivered when every `media.required_profiles` derivative of it is READY. With
`media.succeed_with_proxy_only` a task succeeds once each output's proxy MP4 is READY (its HLS or thumbnail may
still be rebuilt later), so there the proxy alone makes an output delivered.
"""

from __future__ import annotations

from aivedio_engine.config import MediaSettings
from aivedio_engine.db import assets as asset_rows
from aivedio_engine.db.handles import Connection
from aivedio_engine.db.records import Task
from aivedio_engine.domain.status import DerivativeProfile


def delivery_profiles(media: MediaSettings) -> frozenset[str]:
    """The derivatives that must be READY for an output to count as delivered."""
    if media.succeed_with_proxy_only:
        return frozenset({DerivativeProfile.PROXY_MP4.value})
    return frozenset(p.value for p in media.required_profiles)


def delivered_outputs(conn: Connection, task: Task, media: MediaSettings) -> int:
    """How many outputs of the task's job are delivered now (0 before any output was stored)."""
    if task.output_asset_id is None:
        return 0
    needed = delivery_profiles(media)
    outputs = asset_rows.raw_outputs(conn, task.output_asset_id, media.pipeline_version)
    return sum(1 for o in outputs if needed <= o.ready_profiles)
