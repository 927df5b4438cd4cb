"""The `sim` provider: a standalone HTTP vendor simulator with seeded faults and its own ground truth.

`server` is the vendor (FastAPI app + state), `faults` parses fault specs and owns the seeded dice,
`adapter` is the engine-side Provider that talks to it over real HTTP like any vendor adapter would.
"""
