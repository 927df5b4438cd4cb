"""Benchmarks: commands that measure aivedio against a physical baseline taken in the same run (A-B-A).

Run `python -m bench <name>` or `bench/run <name>`; see bench/README.md and shared for the rules.
"""
