"""Chaos tier: real processes killed mid-flight, then the invariants are checked."""
