"""Builders for the hostile files of the upload abuse corpus, and the pure parts of
the corpus: the keys a client can and cannot write. tests/api/test_upload_abuse.py uploads what is built here.
"""

from __future__ import annotations

import struct
import uuid
import zlib

import pytest

from aivedio_engine.storage import keys


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(width: int, height: int, rows: int | None = None) -> bytes:
    """An RGBA PNG declaring width x height; `rows=None` writes every (all-zero) row, so the file is a valid,
    small decompression bomb (16000² RGBA decodes to 1 GB); fewer rows keep only the header honest."""
    compressor = zlib.compressobj(1)
    row = b"\x00" * (width * 4 + 1)
    idat = b"".join(compressor.compress(row) for _ in range(height if rows is None else rows)) + compressor.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def avi_with_gab2(avi: bytes, playlist: bytes) -> bytes:
    """The 2017 LFI shape (U12): an AVI whose stream data carries a GAB2 block holding an HLS playlist, added as
    a chunk of the movi list with the RIFF and LIST sizes fixed up. No AVI demuxer may ever parse it."""
    block = b"GAB2\x00\x02\x00" + struct.pack("<I", len(playlist)) + playlist
    chunk = b"02tx" + struct.pack("<I", len(block)) + block + (b"\x00" if len(block) % 2 else b"")
    at = avi.index(b"movi") + 4
    out = bytearray(avi[:at] + chunk + avi[at:])
    struct.pack_into("<I", out, 4, len(out) - 8)
    movi_list = out.rindex(b"LIST", 0, at)
    struct.pack_into("<I", out, movi_list + 4, struct.unpack_from("<I", out, movi_list + 4)[0] + len(chunk))
    return bytes(out)


#: offset of the 32-bit duration from the atom type, in version-0 mvhd / mdhd / tkhd
_DURATION_AT = ((b"mvhd", 20), (b"mdhd", 20), (b"tkhd", 28))


def with_huge_duration(mp4: bytes) -> bytes:
    """U16: every duration field set to 0xFFFFFFFF (~4.3e6 s at timescale 1000)."""
    data = bytearray(mp4)
    for atom, offset in _DURATION_AT:
        i = data.find(atom)
        while i != -1:
            data[i + offset : i + offset + 4] = b"\xff" * 4
            i = data.find(atom, i + 1)
    return bytes(data)


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
    fake = b"".join(b"\x00" * 4 + atom + b"\x00" * (offset + 8) for atom, offset in _DURATION_AT)
    patched = with_huge_duration(fake)
    for atom, offset in _DURATION_AT:
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
