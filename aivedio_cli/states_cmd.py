"""`aivedio states` (placeholder until the state machines land)."""


def states() -> None:
    """Print a state machine."""
