"""Magic-number check: what the first bytes say a file is, compared with what the client declared.

A cheap pre-filter before ffprobe, which stays the authoritative container check. It exists mainly for the text
formats ffmpeg would happily follow (HLS playlists, ffconcat lists: the classic ffmpeg SSRF/LFI vectors) and for
markup a browser might render: those are refused here by name, before any demuxer sees them.
"""

from __future__ import annotations

from dataclasses import dataclass

import filetype

#: bytes needed by every signature below (filetype reads up to 8 KiB for some formats)
HEAD_BYTES = 8192

#: detected MIME type → family; anything not listed is refused whatever was declared.
FAMILIES: dict[str, str] = {
    "image/png": "image",
    "image/jpeg": "image",
    "image/webp": "image",
    "video/mp4": "video",
    "video/x-m4v": "video",
    "video/quicktime": "video",
    "video/webm": "video",
    "video/x-matroska": "video",
}

#: text formats worth naming in the rejection, matched on the first non-blank bytes (case-insensitive)
_TEXT_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"#extm3u", "an HLS playlist"),
    (b"ffconcat", "an ffconcat list"),
    (b"file ", "a concat list"),
    (b"<?xml", "XML/SVG markup"),
    (b"<svg", "SVG markup"),
    (b"<!doctype", "HTML markup"),
    (b"<html", "HTML markup"),
    (b"<script", "HTML markup"),
)


@dataclass(frozen=True, slots=True)
class Sniffed:
    mime: str | None
    family: str | None
    #: a human description of what the bytes are, for rejection messages
    description: str


def sniff(head: bytes) -> Sniffed:
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    for signature, description in _TEXT_SIGNATURES:
        if stripped.startswith(signature):
            return Sniffed(None, None, description)
    if not head:
        return Sniffed(None, None, "an empty file")
    kind = filetype.guess(head[:HEAD_BYTES])
    if kind is None:
        return Sniffed(None, None, "unrecognised data")
    return Sniffed(kind.mime, FAMILIES.get(kind.mime), kind.mime)


def family_of(content_type: str) -> str:
    return content_type.split("/", 1)[0]


def check_declared(head: bytes, declared_content_type: str) -> tuple[Sniffed, str | None]:
    """(what was found, rejection reason or None). Only the family must match: a .mov declared as video/mp4
    is the same kind of thing, and ffprobe decides whether the container is acceptable."""
    found = sniff(head)
    expected = family_of(declared_content_type)
    if found.family != expected:
        return found, f"content is {found.description}, not {declared_content_type}"
    return found, None
