"""Provider adapters: one module per vendor behind the Protocol in `base.py`."""
