"""What code outside the persistence layer may hold of the database: the engine, a connection (one unit of work,
passed on to repositories) and the errors a statement can raise (and ArgumentError, an unusable database URL's).
Services and shells import these names from here, never from SQLAlchemy, so `aivedio_engine/db/` stays the only
code that builds SQL (tests/architecture/test_import_contract.py)."""

from __future__ import annotations

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout

__all__ = [
    "ArgumentError",
    "Connection",
    "DBAPIError",
    "Engine",
    "IntegrityError",
    "OperationalError",
    "PoolTimeout",
    "SQLAlchemyError",
]
