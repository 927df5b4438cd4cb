"""Process roles that talk to the broker: broker setup, thin actors, the outbox relay and the process runtime.

Importing this package loads nothing: `broker.setup_broker` must run before actors are declared
(`actors.declare_actors`), and `runtime.run` does both in that order.
"""
