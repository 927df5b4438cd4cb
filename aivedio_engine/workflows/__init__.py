"""System B (seed 004): multi-step production workflows built on the generation engine."""
