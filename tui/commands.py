"""The command palette (`:` or Ctrl+P): go to a screen by name or k9s-style alias, or open a task by its id or
the start of it (at least `MIN_PREFIX` hex digits: what fits in a narrow column or a chat message)."""

from __future__ import annotations

import asyncio
import re
import uuid
from functools import partial
from typing import TYPE_CHECKING

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from tui.app import AivedioApp


#: fewer hex digits than this match too many ids to be meant as one (and "add", "face" are words)
MIN_PREFIX = 6
_HEX = re.compile(r"^[0-9a-fA-F-]+$")


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
        word = text.split()[-1] if text else ""
        if _HEX.match(word) and len(word.replace("-", "")) >= MIN_PREFIX:
            try:  # the database read runs in a thread: the palette stays responsive
                found = await asyncio.to_thread(self.ops.data.find_tasks, word)
            except Exception:  # noqa: BLE001 - no hits then; the screens below still match by name
                found = []
            for row in found:
                yield Hit(
                    1.0,
                    f"Open task {row.task_id}",
                    partial(self.ops.open_task, row.task_id),
                    help=f"{row.status} · {row.tenant} · {row.provider or '-'} · {row.model}",
                )
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
