"""The types every route uses for what a client sends: the one place input is bounded before a service sees it.

PostgreSQL text cannot hold NUL and a lone surrogate cannot be encoded as UTF-8 at all: either one, let
through, fails in the driver as a 500 (and SQLite would store what PostgreSQL refuses, so the two modes would
disagree). Integers are strict: JSON `true` or `"2"` is not a duration. A bound stated here is also what the
OpenAPI schema says, so clients and the fuzzer see the real constraints.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from aivedio_engine.domain.idempotency import KEY_MAX, KEY_PATTERN
from aivedio_engine.domain.text import is_storable

#: the largest value a BIGINT column (task versions, sizes) holds
MAX_BIGINT = 2**63 - 1
#: what the schema says of an Idempotency-Key (header or query): the key once the whitespace around the value is
#: removed; the service judges it (domain.idempotency), so a bad one is its 400 with the reason, not a 422
KEY_SCHEMA = {"pattern": KEY_PATTERN, "maxLength": KEY_MAX}


def storable(value: str) -> str:
    if not is_storable(value):
        raise ValueError("must not contain NUL characters or unpaired surrogates")
    return value


#: what the schema says of every `Text`: no NUL (JSON Schema regexes cannot name an unpaired surrogate)
TEXT_PATTERN = "^[^\\u0000]*$"

#: free text and names: anything a database can store
Text = Annotated[str, AfterValidator(storable), Field(json_schema_extra={"pattern": TEXT_PATTERN})]
