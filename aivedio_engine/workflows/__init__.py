"""System B: multi-step production workflows built on the generation engine."""
