"""Test harness pieces that ship with the engine because tests and benchmarks drive real processes with them.

Nothing here changes behaviour unless a test switches it on (see `failpoints`).
"""
