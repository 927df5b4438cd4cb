"""The pure domain core: status enums, transition tables and decide(), failure policy, capacity model.

Standard library only — no database, network, broker or UI imports (an architecture test enforces it).
Time always comes in as an argument.
"""
