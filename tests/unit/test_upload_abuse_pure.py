"""The builders of the upload abuse corpus's hostile files (tests/support/hostile_media.py) make what they claim,
and the pure parts of the corpus: the keys a client can and cannot write. tests/api/test_upload_abuse.py uploads
what the builders make.
"""

from __future__ import annotations

import struct
import uuid
import zlib

import pytest

from aivedio_engine.storage import keys
from tests.support.hostile_media import DURATION_AT, png, with_huge_duration


def test_png_builder_writes_a_valid_image_of_the_declared_size() -> None:
    data = png(7, 3)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,), kind = struct.unpack_from(">I", data, pos), data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        assert struct.unpack_from(">I", data, pos + 8 + length)[0] == zlib.crc32(kind + body)
        chunks[kind], pos = body, pos + 12 + length
    assert struct.unpack(">II", chunks[b"IHDR"][:8]) == (7, 3)
    assert len(zlib.decompress(chunks[b"IDAT"])) == 3 * (7 * 4 + 1)  # every row present: a real image


def test_duration_builder_rewrites_every_duration_field() -> None:
    fake = b"".join(b"\x00" * 4 + atom + b"\x00" * (offset + 8) for atom, offset in DURATION_AT)
    patched = with_huge_duration(fake)
    for atom, offset in DURATION_AT:
        i = patched.find(atom)
        assert patched[i + offset : i + offset + 4] == b"\xff" * 4


T, A, S = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


def test_u6_clients_write_only_a_server_generated_staging_key() -> None:
    assert keys.upload_staging_key(T, S) == f"tenants/{T}/quarantine/{S}"
    assert keys.is_quarantined(keys.upload_staging_key(T, S))
    for bad in ("../other", f"{T}/../x", ""):
        with pytest.raises(ValueError):
            keys.upload_staging_key(bad, S)


def test_u5_each_validation_publishes_under_its_own_key() -> None:
    first, second = uuid.uuid4(), uuid.uuid4()
    a = keys.asset_original_key(T, A, "video/mp4", first)
    b = keys.asset_original_key(T, A, "video/mp4", second)
    assert a == f"tenants/{T}/assets/{A}/original-{first.hex}.mp4" and a != b
    assert keys.upload_staging_key(T, S) not in (a, b)
    with pytest.raises(ValueError):
        keys.asset_original_key(T, A, "video/mp4", "../../x")
