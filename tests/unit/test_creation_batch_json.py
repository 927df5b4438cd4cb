"""The create batch's JSON document (`db/creation_batch._json`): orjson's output, read back as the stdlib reads it,
and the stdlib's where orjson refuses a value."""

from __future__ import annotations

import json

from aivedio_engine.db import creation_batch


def test_the_document_reads_back_as_what_was_written() -> None:
    value = [{"id": "0f" * 16, "prompt": "un renard roux — 雪", "cost": "1.25", "n": 3, "x": 2.5, "none": None}]
    assert json.loads(creation_batch._json(value)) == value


def test_an_integer_orjson_refuses_is_written_by_the_stdlib_encoder() -> None:
    value = {"params": {"seed": 2**70, "ok": True}}
    assert json.loads(creation_batch._json(value)) == value
