"""One module per screen; `base.OpsScreen` holds what they share (loading in workers, filter, help keys)."""
