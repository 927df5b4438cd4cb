"""Database access: the engine factory, the SQLAlchemy Core mirror of the schema, and the migration runner."""

from aivedio_engine.db.engine import make_engine
from aivedio_engine.db.tables import metadata

__all__ = ["make_engine", "metadata"]
