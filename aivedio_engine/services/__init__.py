"""Use cases, one short transaction each: the only API the front ends (HTTP, CLI, TUI, actors) call."""
