"""Partial media success and the derivatives made after it.

When `media.succeed_with_proxy_only` is set and a run leaves the proxy MP4 READY while another required
derivative (HLS, the thumbnail) failed for a reason another run may fix, the task succeeds on the proxy: the
failed derivative keeps its own FAILED row (each derivative has its own status and pipeline version, never one
flag for all) and a `derivatives_only` media message, delayed by the media budget's backoff, builds it again
for the SUCCEEDED task — without any state change, settlement or notification, which the success already did.
Those late runs stop after the media budget's `max_attempts`; the FAILED row then stays for an operator.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Protocol

from aivedio_engine.config import Settings
from aivedio_engine.db.handles import Connection
from aivedio_engine.db.records import Task
from aivedio_engine.domain.retry import Step
from aivedio_engine.domain.status import AssetStatus, DerivativeProfile
from aivedio_engine.services import follow_on
from aivedio_engine.services.follow_on import MediaProcessRequested, StepTries


class _Derived(Protocol):
    @property
    def status(self) -> str: ...
    @property
    def retryable(self) -> bool: ...
    @property
    def interrupted(self) -> bool: ...


def proxy_suffices(
    settings: Settings,
    missing: Iterable[DerivativeProfile],
    derived: Mapping[DerivativeProfile, _Derived],
    unavailable: str | None,
) -> bool:
    """May the task succeed on its proxy MP4 although `missing` (required, not READY) failed?"""
    missing = list(missing)
    if not settings.media.succeed_with_proxy_only or unavailable or not missing:
        return False
    proxy = derived.get(DerivativeProfile.PROXY_MP4)
    if proxy is None or proxy.status != AssetStatus.READY.value or DerivativeProfile.PROXY_MP4 in missing:
        return False
    # a final failure (the content at fault) is not "retryable"; an interrupted run is retried whole at once
    return all(p in derived and derived[p].retryable and not derived[p].interrupted for p in missing)


def schedule_rebuild(
    conn: Connection,
    task: Task,
    request: MediaProcessRequested,
    settings: Settings,
    now: datetime,
    rng: random.Random,
) -> bool:
    """Write the next derivatives-only run, delayed; False once the media budget's attempts are spent."""
    budget = settings.retry.budget(Step.MEDIA)
    tried = request.tries.tried if request.derivatives_only else 0
    if tried >= budget.max_attempts:
        return False
    first = request.tries.first_failure_at or now
    delay = rng.uniform(0, budget.delay_cap(tried))
    message = replace(request, derivatives_only=True, redriven=False, tries=StepTries(tried + 1, first, now))
    follow_on.emit(conn, task, message, version=int(task.version), now=now, available_at=now + timedelta(seconds=delay))
    return True
