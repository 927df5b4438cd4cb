"""System B projects: workflow definitions as a DAG of typed steps, and the project state machine.

A project's status is never set by a worker: the workflow service derives it from its steps' statuses after each
step report and applies it through `PROJECT_MACHINE`, so an edge that does not exist is refused.
Steps marked `per_shot` are expanded at run time into one step per shot of the plan (`image[0]`, `image[1]`…);
their dependants wait for all of them. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from aivedio_engine.domain.machine import Machine, Rule
from aivedio_engine.domain.workflow import STEP_SPECS, StepStatus, StepType


class ProjectStatus(StrEnum):
    CREATED = "created"
    RUNNING = "running"
    #: a step waits for a person (manual_required): review it, retry it or cancel the project
    NEEDS_ATTENTION = "needs_attention"
    #: a required step failed for good; `projects retry-step` puts it back to pending
    FAILED = "failed"
    SUCCEEDED = "succeeded"
    CANCELLED = "cancelled"


PROJECT_TERMINAL = frozenset({ProjectStatus.SUCCEEDED, ProjectStatus.CANCELLED})


class ProjectEvent(StrEnum):
    STEP_STARTED = "step_started"
    STEP_ESCALATED = "step_escalated"
    STEP_FAILED = "step_failed"
    STEP_RESUMED = "step_resumed"
    ALL_DONE = "all_done"
    CANCEL_REQUESTED = "cancel_requested"


P = ProjectStatus
PE = ProjectEvent
_OPEN = (P.CREATED, P.RUNNING, P.NEEDS_ATTENTION, P.FAILED)

PROJECT_MACHINE: Machine[ProjectStatus, ProjectEvent] = Machine(
    "project",
    ProjectStatus,
    ProjectEvent,
    initial=P.CREATED,
    terminal=PROJECT_TERMINAL,
    rules=[
        Rule((P.CREATED,), PE.STEP_STARTED, P.RUNNING, "the first step was picked up"),
        Rule((P.CREATED, P.RUNNING, P.FAILED), PE.STEP_ESCALATED, P.NEEDS_ATTENTION, "a step is manual_required"),
        Rule((P.CREATED, P.RUNNING, P.NEEDS_ATTENTION), PE.STEP_FAILED, P.FAILED, "a required step failed for good"),
        Rule((P.NEEDS_ATTENTION, P.FAILED), PE.STEP_RESUMED, P.RUNNING, "retried or approved: work goes on"),
        Rule((P.CREATED, P.RUNNING, P.NEEDS_ATTENTION), PE.ALL_DONE, P.SUCCEEDED, "every required step succeeded"),
        Rule(_OPEN, PE.CANCEL_REQUESTED, P.CANCELLED, "open steps are cancelled with it"),
    ],
)

#: the event that leads to each derived status
_EVENT_FOR: dict[ProjectStatus, ProjectEvent] = {
    P.RUNNING: PE.STEP_STARTED,
    P.NEEDS_ATTENTION: PE.STEP_ESCALATED,
    P.FAILED: PE.STEP_FAILED,
    P.SUCCEEDED: PE.ALL_DONE,
    P.CANCELLED: PE.CANCEL_REQUESTED,
}


@dataclass(frozen=True, slots=True)
class StepDef:
    key: str
    type: StepType
    needs: tuple[str, ...] = ()
    #: one instance per shot of the plan (the plan step's output says how many)
    per_shot: bool = False
    #: its failure does not hold up the project (lip sync)
    optional: bool = False
    description: str = ""


class WorkflowError(ValueError):
    """A workflow definition that cannot run: unknown dependency, a cycle, a duplicate key."""


@dataclass(frozen=True, slots=True)
class WorkflowDef:
    name: str
    description: str
    steps: tuple[StepDef, ...]

    def __post_init__(self) -> None:
        keys = [s.key for s in self.steps]
        if len(set(keys)) != len(keys):
            raise WorkflowError(f"workflow {self.name}: duplicate step keys")
        known = set(keys)
        for s in self.steps:
            missing = [n for n in s.needs if n not in known]
            if missing:
                raise WorkflowError(f"workflow {self.name}: step {s.key} needs unknown {', '.join(missing)}")
        self.order()  # raises on a cycle

    def step(self, key: str) -> StepDef:
        for s in self.steps:
            if s.key == key:
                return s
        raise KeyError(key)

    def order(self) -> list[StepDef]:
        """The steps in dependency order (Kahn's algorithm, ties in declaration order)."""
        done: list[StepDef] = []
        placed: set[str] = set()
        remaining = list(self.steps)
        while remaining:
            ready = [s for s in remaining if all(n in placed for n in s.needs)]
            if not ready:
                raise WorkflowError(f"workflow {self.name}: a cycle among {', '.join(s.key for s in remaining)}")
            for s in ready:
                done.append(s)
                placed.add(s.key)
            remaining = [s for s in remaining if s.key not in placed]
        return done

    def instances(self, shots: int | None) -> list[str]:
        """Step instance keys for a plan of `shots` shots (per-shot steps only once the plan is known)."""
        out: list[str] = []
        for s in self.order():
            if s.per_shot:
                out.extend(f"{s.key}[{i}]" for i in range(shots or 0))
            else:
                out.append(s.key)
        return out

    def mermaid(self) -> str:
        """`aivedio workflows describe NAME --format mermaid`: the DAG, per-shot steps drawn once."""
        lines = ["flowchart TD"]
        for s in self.order():
            spec = STEP_SPECS[s.type]
            shape = f"{s.key}{'[]' if s.per_shot else ''}<br/>{s.type} · {spec.queue} queue"
            lines.append(f'    {s.key}["{shape}"]')
        for s in self.order():
            for n in s.needs:
                lines.append(f"    {n} --> {s.key}")
        return "\n".join(lines)


def base_key(instance: str) -> str:
    return instance.split("[", 1)[0]


def ready_steps(wf: WorkflowDef, statuses: Mapping[str, StepStatus], shots: int | None) -> list[str]:
    """Instances that may start now: still pending, and every instance of every step they need succeeded (per-shot
    steps pair by index; an optional need that ended failed/manual counts as done). Per-shot steps appear once the
    plan is known."""
    by_base: dict[str, list[str]] = {}
    for inst in wf.instances(shots):
        by_base.setdefault(base_key(inst), []).append(inst)

    def satisfied(inst: str, need: str) -> bool:
        step, needed = wf.step(base_key(inst)), wf.step(need)
        # per shot after per shot pairs by index: clip[2] waits for image_qc[2] only
        insts = [f"{need}{inst[len(step.key) :]}"] if step.per_shot and needed.per_shot else by_base.get(need, [])
        if not insts:
            return False
        ok = {StepStatus.SUCCESS}
        if needed.optional:
            ok |= {StepStatus.FAILED, StepStatus.MANUAL_REQUIRED}
        return all(statuses.get(i) in ok for i in insts)

    out = []
    for inst in wf.instances(shots):
        if statuses.get(inst, StepStatus.PENDING) is not StepStatus.PENDING:
            continue
        if all(satisfied(inst, n) for n in wf.step(base_key(inst)).needs):
            out.append(inst)
    return out


def derive_status(wf: WorkflowDef, statuses: Mapping[str, StepStatus], shots: int | None) -> ProjectStatus:
    """The project status its steps imply (never CANCELLED: only a cancel request makes that)."""
    required = [i for i in wf.instances(shots) if not wf.step(base_key(i)).optional]
    values = [statuses.get(i, StepStatus.PENDING) for i in required]
    if any(v is StepStatus.MANUAL_REQUIRED for v in values):
        return P.NEEDS_ATTENTION
    if any(v is StepStatus.FAILED for v in values):
        return P.FAILED
    plan_known = shots is not None or not any(s.per_shot for s in wf.steps)
    if plan_known and values and all(v is StepStatus.SUCCESS for v in values):
        optional_open = [
            i
            for i in wf.instances(shots)
            if wf.step(base_key(i)).optional
            and statuses.get(i, StepStatus.PENDING) in (StepStatus.PENDING, StepStatus.RUNNING, StepStatus.RETRYING)
        ]
        if not optional_open:
            return P.SUCCEEDED
    if all(v is StepStatus.PENDING for v in statuses.values()):
        return P.CREATED
    return P.RUNNING


def project_event(current: ProjectStatus, target: ProjectStatus) -> ProjectEvent | None:
    """The machine event moving `current` to `target`, or None when there is nothing to apply (same status, or
    no such edge — the caller records it as refused rather than forcing it)."""
    if current == target:
        return None
    event = _EVENT_FOR.get(target)
    if event is None:  # back to CREATED never happens
        return None
    edge = PROJECT_MACHINE.edge(current, event)
    if edge is None and target is P.RUNNING and current in (P.NEEDS_ATTENTION, P.FAILED):
        event = PE.STEP_RESUMED
        edge = PROJECT_MACHINE.edge(current, event)
    return event if edge is not None and edge.target == target else None


def statuses_of(rows: Iterable[tuple[str, str]]) -> dict[str, StepStatus]:
    return {key: StepStatus(status) for key, status in rows}
