"""The types every route uses for what a client sends: the one place input is bounded before a service sees it.

PostgreSQL text cannot hold NUL and a lone surrogate cannot be encoded as UTF-8 at all: either one, let
through, fails in the driver as a 500 (and SQLite would store what PostgreSQL refuses, so the two modes would
disagree). Integers are strict: JSON `true` or `"2"` is not a duration. A bound stated here is also what the
OpenAPI schema says, so clients and the fuzzer see the real constraints.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from aivedio_engine.domain.text import is_storable

#: the largest value a BIGINT column (task versions, sizes) holds
MAX_BIGINT = 2**63 - 1
#: Idempotency-Key: printable ASCII, no leading or trailing space (proxies strip it), at most 255 characters
IDEMPOTENCY_KEY_MAX = 255
IDEMPOTENCY_KEY_PATTERN = r"^[!-~]([ -~]*[!-~])?$"


def storable(value: str) -> str:
    if not is_storable(value):
        raise ValueError("must not contain NUL characters or unpaired surrogates")
    return value


#: what the schema says of every `Text`: no NUL (JSON Schema regexes cannot name an unpaired surrogate)
TEXT_PATTERN = "^[^\\u0000]*$"

#: free text and names: anything a database can store
Text = Annotated[str, AfterValidator(storable), Field(json_schema_extra={"pattern": TEXT_PATTERN})]
