"""The command palette (`:` or Ctrl+P): go to a screen by name or k9s-style alias, or open a task by its id."""

from __future__ import annotations

import uuid
from functools import partial
from typing import TYPE_CHECKING

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from tui.app import AivedioApp


class ScreensProvider(Provider):
    @property
    def ops(self) -> AivedioApp:
        return self.app  # type: ignore[return-value]

    async def discover(self) -> Hits:
        for entry in self.ops.entries:
            yield DiscoveryHit(
                f"{entry.title}", partial(self.ops.action_goto, entry.mode), help=f"key {entry.key} · {entry.help}"
            )

    async def search(self, query: str) -> Hits:
        text = query.strip()
        try:
            task_id = uuid.UUID(text.split()[-1]) if text else None
        except ValueError:
            task_id = None
        if task_id is not None:
            yield Hit(1.0, f"Open task {task_id}", partial(self.ops.open_task, task_id), help="the task's timeline")
            return
        matcher = self.matcher(text)
        for entry in self.ops.entries:
            # best of the title and the aliases, but the title is what is shown (highlighted when it matched)
            score = max(matcher.match(name) for name in (entry.title, entry.mode, *entry.aliases))
            if score > 0:
                yield Hit(
                    score,
                    matcher.highlight(entry.title),
                    partial(self.ops.action_goto, entry.mode),
                    text=entry.title,
                    help=f"key {entry.key} · {entry.help}",
                )
