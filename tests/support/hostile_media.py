"""Byte builders for hostile uploads: a PNG of any declared size (a decompression bomb is a small file), an AVI
carrying an HLS playlist in a GAB2 chunk (the ffmpeg network-read trick), an MP4 claiming an absurd duration."""

from __future__ import annotations

import struct
import zlib


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
DURATION_AT = ((b"mvhd", 20), (b"mdhd", 20), (b"tkhd", 28))


def with_huge_duration(mp4: bytes) -> bytes:
    """U16: every duration field set to 0xFFFFFFFF (~4.3e6 s at timescale 1000)."""
    data = bytearray(mp4)
    for atom, offset in DURATION_AT:
        i = data.find(atom)
        while i != -1:
            data[i + offset : i + offset + 4] = b"\xff" * 4
            i = data.find(atom, i + 1)
    return bytes(data)
