"""A finite state machine as data: explicit edges only, terminal states sticky.

Both the task and the attempt machines are instances of `Machine`; `transitions.py` holds their tables.
Edges are written with groups of source states for readability and expanded here, so the rest of the code
(and `aivedio states --format json`) sees one edge per (state, event).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

S = TypeVar("S", bound=StrEnum)
E = TypeVar("E", bound=StrEnum)


@dataclass(frozen=True, slots=True)
class Edge(Generic[S, E]):
    source: S
    event: E
    target: S
    #: the condition and side effects the seed names for this edge, for people reading `aivedio states`.
    note: str = ""


@dataclass(frozen=True, slots=True)
class Rule(Generic[S, E]):
    """One row of a transition table; `sources` may be a group of states."""

    sources: tuple[S, ...]
    event: E
    target: S
    note: str = ""


class Machine(Generic[S, E]):
    def __init__(
        self,
        name: str,
        states: type[S],
        events: type[E],
        initial: S,
        terminal: Iterable[S],
        rules: Iterable[Rule[S, E]],
    ) -> None:
        self.name = name
        self.states = states
        self.events = events
        self.initial = initial
        self.terminal: frozenset[S] = frozenset(terminal)
        table: dict[tuple[S, E], Edge[S, E]] = {}
        for rule in rules:
            for source in rule.sources:
                if source in self.terminal:
                    raise ValueError(f"{name}: terminal state {source} cannot have an exit ({rule.event})")
                key = (source, rule.event)
                if key in table:
                    raise ValueError(f"{name}: two rules for {source} + {rule.event}")
                table[key] = Edge(source, rule.event, rule.target, rule.note)
        self._table: Mapping[tuple[S, E], Edge[S, E]] = table
        state_order = {s: i for i, s in enumerate(states)}
        event_order = {e: i for i, e in enumerate(events)}
        self._edges = tuple(sorted(table.values(), key=lambda e: (state_order[e.source], event_order[e.event])))

    def edge(self, state: S, event: E) -> Edge[S, E] | None:
        return self._table.get((state, event))

    def edges(self) -> list[Edge[S, E]]:
        """Every allowed edge, in declaration order of states then events."""
        return list(self._edges)

    def targets(self, state: S) -> set[S]:
        return {e.target for e in self._edges if e.source == state}

    def reachable_from(self, start: S) -> set[S]:
        seen = {start}
        todo = [start]
        while todo:
            for nxt in self.targets(todo.pop()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen
