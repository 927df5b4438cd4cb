"""`aivedio generations download`: a finished task's files written to a folder, each checked against the SHA-256
its asset row recorded when the engine stored it.

Works on any `TaskClient`: embedded, it reads the objects from the store (derivatives and the original output);
remote, it follows the signed URLs of the task's `outputs` (derivatives only: the API never serves the raw
provider output). The HLS playlist is written as stored, with plain segment names, and every file it names is
fetched beside it, so the folder plays offline; segments have no asset row of their own, so their checksum is
computed and shown, not compared.

A file whose bytes differ from the record is not kept: it is written to `NAME.part` while hashing and removed
when the digest (or the size) is wrong; a good one is renamed into place, replacing an earlier download.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from aivedio_engine.client import ClientError, OutputObject, TaskClient

#: a cap for files without a recorded size (HLS segments): far above anything the media pipeline writes
MAX_UNKNOWN_BYTES = 8 * 1024**3
HLS_DIR = "hls"
ORIGINAL = "original"


@dataclass(frozen=True)
class DownloadedFile:
    profile: str
    path: Path
    size_bytes: int
    sha256: str
    #: what the asset row recorded (None: no row of its own, e.g. an HLS segment)
    expected_sha256: str | None
    #: why the file was not kept, when it differs from the record
    problem: str | None = None

    @property
    def verified(self) -> bool:
        return self.problem is None and self.expected_sha256 is not None

    def as_dict(self) -> dict[str, object]:
        return {
            "profile": self.profile,
            "path": str(self.path),
            "size_bytes": self.size_bytes,
            "sha256": self.sha256,
            "expected_sha256": self.expected_sha256,
            "verified": self.verified,
            "problem": self.problem,
        }


@dataclass
class Download:
    task_id: str
    out_dir: Path
    files: list[DownloadedFile] = field(default_factory=list)
    #: things not downloaded and why (e.g. the original output over the API)
    notes: list[str] = field(default_factory=list)

    @property
    def bad(self) -> list[DownloadedFile]:
        return [f for f in self.files if f.problem is not None]

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.task_id,
            "out": str(self.out_dir),
            "ok": not self.bad,
            "files": [f.as_dict() for f in self.files],
            "notes": list(self.notes),
        }


def download(client: TaskClient, task_id: str, out_dir: Path) -> Download:
    """Write every output of the SUCCEEDED task `task_id` under `out_dir`; `Download.bad` lists the files whose
    bytes differ from their record. Raises ClientError when the task has no outputs or a file cannot be read."""
    snap = client.get(task_id)
    if snap.status != "SUCCEEDED":
        raise ClientError(
            f"generation {task_id} is {snap.status}: only a SUCCEEDED generation has outputs to download",
            "illegal-state",
        )
    objects = client.output_objects(task_id)
    if not objects:
        raise ClientError(f"generation {task_id} has no stored outputs", "not-found")
    result = Download(task_id, out_dir)
    if not any(o.profile == ORIGINAL for o in objects):
        result.notes.append(
            "original: not served over the API (clients get transcoded derivatives only); "
            "download it on the server, without --api-url"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    several = len({o.variant for o in objects}) > 1
    for variant in sorted({o.variant for o in objects}):
        # a request for n outputs: each variant in its own folder v<i>/ (one output: the folder itself)
        folder = out_dir / f"v{variant}" if several else out_dir
        folder.mkdir(exist_ok=True)
        used: set[str] = set()
        for obj in sorted((o for o in objects if o.variant == variant), key=lambda o: o.profile):
            if obj.profile == "hls":
                _hls(client, obj, folder, result)
            else:
                name = _local_name(obj, used)
                result.files.append(_write(obj.profile, client.read(obj), folder / name, obj.sha256, obj.size_bytes))
    return result


def _local_name(obj: OutputObject, used: set[str]) -> str:
    suffix = PurePosixPath(obj.name).suffix if _plain(obj.name) else ""
    name = f"{ORIGINAL}{suffix}" if obj.profile == ORIGINAL else obj.name
    if not _plain(name) or name in used or name == HLS_DIR:
        name = f"{obj.profile}{suffix}"
    used.add(name)
    return name


def _plain(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name


def _hls(client: TaskClient, obj: OutputObject, out_dir: Path, result: Download) -> None:
    stored, parts = client.playlist(obj)
    folder = out_dir / HLS_DIR
    folder.mkdir(exist_ok=True)
    playlist = obj.name if _plain(obj.name) and obj.name.endswith(".m3u8") else "index.m3u8"
    result.files.append(_write(obj.profile, iter([stored]), folder / playlist, obj.sha256, obj.size_bytes))
    for part in parts:
        if not _plain(part.name) or part.name == playlist:
            raise ClientError(f"{obj.name}: the playlist names {part.name[:80]!r}, not a file beside it")
        result.files.append(_write(obj.profile, client.read(part), folder / part.name, part.sha256, part.size_bytes))


def _write(
    profile: str, chunks: Iterator[bytes], path: Path, expected: str | None, expected_size: int | None
) -> DownloadedFile:
    part = path.with_name(path.name + ".part")
    digest = hashlib.sha256()
    size = 0
    cap = expected_size if expected_size is not None else MAX_UNKNOWN_BYTES
    problem = None
    try:
        with open(part, "wb") as f:
            for chunk in chunks:
                size += len(chunk)
                if size > cap:
                    problem = f"larger than the {cap} bytes recorded"
                    break
                digest.update(chunk)
                f.write(chunk)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    sha = digest.hexdigest()
    if problem is None and expected_size is not None and size != expected_size:
        problem = f"{size} bytes, {expected_size} recorded"
    if problem is None and expected is not None and sha != expected.lower():
        problem = f"sha256 {sha[:12]}…, {expected[:12]}… recorded"
    if problem is not None:
        part.unlink(missing_ok=True)
    else:
        os.replace(part, path)
    return DownloadedFile(profile, path, size, sha, expected, problem)
