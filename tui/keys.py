"""One meaning per key, on every screen (tests/tui/test_keys.py holds every screen's bindings to this table).

An operator's fingers learn a key once: `k` acknowledges wherever it works, `p` always means "process it
again" (replay a dead letter, reconcile an ambiguous submit, retry a workflow step), `n` always steps to the
next view of the same screen. A screen that binds a key not listed here, or a listed key to an action outside its
meaning, fails the test; a new action either fits a meaning here or gets a key of its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Meaning:
    what: str
    #: the action names a screen may bind this key to
    actions: frozenset[str]


def _m(what: str, *actions: str) -> Meaning:
    return Meaning(what, frozenset(actions))


MEANINGS: dict[str, Meaning] = {
    "enter": _m("open the highlighted row (its detail, or the list behind a count)", "open", "open_alert", "drill"),
    "escape": _m("back", "back"),
    "slash": _m("filter the list", "filter"),
    "r": _m("refresh (read again)", "reload"),
    "y": _m("copy the highlighted id (OSC 52 clipboard)", "copy_id"),
    "o": _m("open the output (system player, or a signed playback URL)", "open_media"),
    "n": _m("next view of this screen (pile, window)", "next_kind", "window"),
    "f": _m("freeze/resume the live refresh", "pause"),
    "p": _m("process the highlighted row again (replay, reconcile, retry)", "replay", "reconcile", "retry"),
    "P": _m("process every listed row again", "replay_all", "reconcile_all"),
    "a": _m("approve", "approve"),
    "x": _m("close it: cancel the task, reject the output, resolve the alert", "cancel", "reject", "resolve"),
    "c": _m("claim", "claim"),
    "k": _m("acknowledge", "acknowledge"),
    "space": _m("mark/unmark the row", "mark"),
    "e": _m("enter a ledger adjustment", "adjust"),
    "b": _m("bind the highlighted ambiguous submit to a job found in the vendor's console", "bind_job"),
    "d": _m("declare the vendor never created the highlighted submit's job", "not_created"),
}
