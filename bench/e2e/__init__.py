"""The parts of the `e2e_overhead` benchmark (`bench/e2e_overhead.py` runs them; its docstring is the method)."""
