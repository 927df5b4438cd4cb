"""System B concurrency limits, decided when a worker claims a due step. Pure.

- per project: at most N image steps running at once, and one composition;
- per queue: `real_video_clip` and `lipsync` each have their own cap on running steps across the deployment (
  隔离原则: costly video work must not crowd out images and ordinary composition), and any other queue may be
  given one;
- per user: one formal project at a time is a uniqueness rule on open projects, refused when a second
  is created (`uq_projects_open_formal_user`), so a claim never has to wait for it;
- per provider: a vendor step (one that creates a generation task) starts at most at its
  provider's rate (a token bucket, `vendor_rate`); a step refused a token is woken again when one will be there.
  The concurrency of the generation tasks those steps create is the engine's own slot admission
  (`providers.*.max_concurrency`, tenant and platform caps), as for any other generation.

A step that may not start stays due; it is announced again when a step of its project or queue stops running.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from aivedio_engine.domain.ratelimit import Rate
from aivedio_engine.domain.workflow import STEP_SPECS, Priority, Scope, StepType


@dataclass(frozen=True, slots=True)
class StepLimits:
    #: image steps (scope `project`) of one project running at once
    project_image_steps: int = 2
    #: running steps per queue name; a queue not listed has no cap of its own
    queue_running: Mapping[str, int] = field(default_factory=dict)
    #: the provider vendor steps call (their generation tasks take the default model's provider)
    vendor_provider: str = "local"
    #: vendor steps started per second, per provider (absent: no rate of its own)
    provider_rate: Mapping[str, Rate] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Running:
    """What runs now, as far as one candidate step is concerned."""

    #: running steps of the candidate's project with the candidate's scope (images, or the composition)
    same_project_scope: int = 0
    #: running steps of the candidate's queue, anywhere
    same_queue: int = 0


def project_cap(task_type: StepType, limits: StepLimits) -> int | None:
    """How many steps of this type's scope one project may run at once (None: no project limit)."""
    scope = STEP_SPECS[task_type].scope
    if scope is Scope.PROJECT:
        return limits.project_image_steps
    if scope is Scope.PROJECT_SINGLE:
        return 1
    return None


def refusal(task_type: StepType, queue: str, running: Running, limits: StepLimits) -> str | None:
    """Why this step may not start now, or None when it may."""
    cap = project_cap(task_type, limits)
    if cap is not None and running.same_project_scope >= cap:
        return f"project limit: {running.same_project_scope} {STEP_SPECS[task_type].scope} step(s) running (max {cap})"
    queue_cap = limits.queue_running.get(queue)
    if queue_cap is not None and running.same_queue >= queue_cap:
        return f"queue {queue} limit: {running.same_queue} running (max {queue_cap})"
    return None


def vendor_rate(task_type: StepType, limits: StepLimits) -> tuple[str, Rate] | None:
    """The token bucket (its key and rate) a step of this type takes a token from before it starts, if any."""
    if not STEP_SPECS[task_type].vendor:
        return None
    rate = limits.provider_rate.get(limits.vendor_provider)
    return None if rate is None else (f"workflow-steps:provider:{limits.vendor_provider}", rate)


def step_priority(task_type: StepType, project_priority: int) -> int:
    """A step's claim priority (1 first): its project's tier, except that cleanup work always comes last."""
    return int(Priority.CLEANUP) if task_type is StepType.CLEANUP else project_priority
