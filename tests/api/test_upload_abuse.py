"""Upload and media abuse corpus (U1–U30): the cases not already covered by
tests/api/test_assets.py, tests/media/test_probe.py, tests/unit/test_probe_policy.py and
tests/integration/test_storage_contract.py (those carry their U-number in a name or comment).

Hostile files are crafted here: by hand (PNG with a huge IHDR, Y4M, AVI with a GAB2 block, gzip, polyglot)
or with ffmpeg's lavfi sources (8K, 1000 fps, 100 streams). Embedded mode = SQLite + fs store; postgres mode =
PostgreSQL + S3 on moto, which enforces none of the POST policy, so these tests prove our own checks.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import socket
import subprocess
import sys
import threading
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from aivedio_engine.bootstrap import AppContext
from aivedio_engine.db.tables import assets, upload_sessions
from aivedio_engine.services.assets import AssetService
from aivedio_engine.services.errors import InvalidInput
from tests.api.test_assets import NO_GRACE, QUARANTINED_THEN_DELETED, Api, _context, rejected_bytes_fate
from tests.media import FFMPEG, hls_playlist, shared_media
from tests.support.app import FakeClock, TenantKey, make_context, tenant_with_key
from tests.support.hostile_media import avi_with_gab2, png, with_huge_duration
from tests.support.sockets import connections

MIB = 1024 * 1024


# --- hostile files -----------------------------------------------------------------------------------------


def _ffmpeg(out: Path, *args: str) -> bytes:
    subprocess.run([*FFMPEG, *args, str(out)], check=True, capture_output=True, timeout=60)
    return out.read_bytes()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    media = shared_media(tmp_path_factory)
    d = tmp_path_factory.mktemp("hostile")
    tiny = (
        "-f",
        "lavfi",
        "-i",
        "testsrc=size=64x48:rate=25:duration=0.2",
        "-c:v",
        "libx264",
        "-preset",
        "ultrafast",
        "-pix_fmt",
        "yuv420p",
    )
    clip = media["clip.mp4"].read_bytes()
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("index.html", "<script>alert(document.domain)</script>")
    return {
        "clip.mp4": clip,
        "image.png": media["image.png"].read_bytes(),
        "png16k": png(16000, 16000),
        "png20k": png(20000, 20000, rows=2),
        "y4m32k": b"YUV4MPEG2 W32768 H32768 F25:1 Ip A1:1 C420jpeg\nFRAME\n" + b"\x80" * 4096,
        "8k.mp4": _ffmpeg(
            d / "8k.mp4",
            "-f",
            "lavfi",
            "-i",
            "color=s=7680x4320:d=0.1:r=10",
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-pix_fmt",
            "yuv420p",
        ),
        "fps1000.mp4": _ffmpeg(d / "fps1000.mp4", *tiny, "-r", "1000"),
        "fps0.001.mp4": _ffmpeg(d / "slow.mp4", *tiny, "-r", "0.001"),
        "streams100.mkv": _ffmpeg(
            d / "s100.mkv",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=64x48:rate=10:duration=0.3",
            "-f",
            "lavfi",
            "-i",
            "sine=duration=0.3",
            "-map",
            "0:v",
            *[a for _ in range(99) for a in ("-map", "1:a")],
            "-c:v",
            "libx264",
            "-preset",
            "ultrafast",
            "-c:a",
            "libopus",
            "-b:a",
            "6k",
        ),
        "avi": _ffmpeg(d / "x.avi", "-f", "lavfi", "-i", "testsrc=size=64x48:rate=10:duration=0.3", "-c:v", "mpeg4"),
        "long.mp4": with_huge_duration(clip),
        "polyglot.mp4": clip + zipped.getvalue() + b"<html><script>alert(document.domain)</script></html>",
        "gzip.mp4": gzip.compress(clip),
    }


# --- contexts ----------------------------------------------------------------------------------------------


@pytest.fixture(params=["embedded", "postgres"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    context = _context(
        request.param, request, tmp_path / "data", clock=FakeClock(), limits={"uploads_per_tenant_per_min": 5}
    )
    yield context
    context.close()


@pytest.fixture
def api(ctx: AppContext) -> Api:
    return Api(ctx)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Api]:
    context = make_context(tmp_path / "data", sweeper=NO_GRACE)
    yield Api(context)
    context.close()


@pytest.fixture
def s3api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Api]:
    context = _context("postgres", request, tmp_path / "data", clock=FakeClock())
    yield Api(context)
    context.close()


def _published(api: Api, asset_id: str) -> list[str]:
    """Every object under the asset's server-only prefix (validated copies)."""
    store = api.ctx.storage
    tenant = api.row(assets, id=uuid.UUID(asset_id)).tenant_id
    prefix = f"tenants/{tenant}/assets/{asset_id}/"
    if store.kind == "fs":
        root = store.root / prefix  # type: ignore[attr-defined]
        return sorted(str(p.relative_to(store.root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []
    client = store._client  # type: ignore[attr-defined]
    listed = client.list_objects_v2(Bucket=store.bucket, Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []))


# --- U8–U20, U29: hostile media rejected at complete(), nothing published -----------------------------------

CORPUS = {
    # case: (file, declared content type, reason fragment)
    "U8-hls-playlist-as-mp4": (None, "video/mp4", "HLS playlist"),
    "U10-svg-as-png": (b"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>", "image/png", "SVG"),
    "U10-js-as-mp4": (b"<script>fetch('/v1/assets')</script>", "video/mp4", "HTML"),
    "U12-avi-gab2-playlist": ("avi-gab2", "video/mp4", "video/x-msvideo, not video/mp4"),
    "U13-png-16000x16000-bomb": ("png16k", "image/png", "pixel limit"),
    "U14-png-20000x20000": ("png20k", "image/png", "pixel limit"),
    "U14-y4m-32768x32768": ("y4m32k", "video/mp4", "unrecognised"),
    "U15-8k-video": ("8k.mp4", "video/mp4", "exceeds specified max pixel count 8294400"),
    "U16-duration-4.3e6s": ("long.mp4", "video/mp4", "duration 4294967.295s exceeds 60s"),
    "U17-fps-1000": ("fps1000.mp4", "video/mp4", "frame rate 1e+03 fps outside [1, 120]"),
    "U17-fps-0.001": ("fps0.001.mp4", "video/mp4", "frame rate 0.001 fps outside [1, 120]"),
    "U18-100-streams": ("streams100.mkv", "video/webm", "Number of streams exceeds max_streams"),
    "U20-one-byte": (b"\x00", "video/mp4", "unrecognised"),
    "U29-gzip-encoded-mp4": ("gzip.mp4", "video/mp4", "application/gzip, not video/mp4"),
}


def test_hostile_media_corpus_is_rejected_and_nothing_is_published(
    local: Api, hostile: dict[str, bytes], listener: tuple[socket.socket, int]
) -> None:
    """One embedded context for the whole corpus (both modes run the shared cases in test_assets.py); the
    final comparison names each case that was not REJECTED for the expected reason or left bytes behind."""
    sock, port = listener
    files = {**hostile, "avi-gab2": avi_with_gab2(hostile["avi"], hls_playlist(f"http://127.0.0.1:{port}/x.ts"))}
    outcomes, expected = {}, {}
    for case, (name, ctype, reason) in CORPUS.items():
        data = hls_playlist(f"http://127.0.0.1:{port}/secret.ts") if name is None else files.get(name, name)
        assert isinstance(data, bytes)
        created = local.create(data, content_type=ctype, filename="upload").json()
        local.upload(created, data)
        asset = local.complete(created["id"]).json()
        staging = local.row(upload_sessions, asset_id=uuid.UUID(created["id"])).object_key
        outcomes[case] = (
            asset["status"],
            reason if reason in (asset["error"] or "") else asset["error"],
            rejected_bytes_fate(local.ctx, staging),
            _published(local, created["id"]),
        )
        expected[case] = ("REJECTED", reason, QUARANTINED_THEN_DELETED, [])
    assert outcomes == expected
    assert connections(sock) == 0  # U8/U12: no playlist was ever followed


# --- U2: declared size over the limit ----------------------------------------------------------------------


def test_u2_declared_size_above_the_limit_is_413_at_presign(tmp_path: Path) -> None:
    context = make_context(tmp_path / "data", api={"max_upload_bytes": 1000})
    try:
        api = Api(context)
        r = api.create(size_bytes=1001)
        assert r.status_code == 413 and r.headers["content-type"] == "application/problem+json"
        assert r.json()["type"].endswith("/payload-too-large") and "1000" in r.json()["detail"]
        assert api.create(size_bytes=1000).status_code == 201
        with context.engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(assets)).scalar_one() == 1
    finally:
        context.close()


def test_u2_a_tenant_plan_cap_replaces_the_platform_cap(tmp_path: Path) -> None:
    """A small plan is refused above its own cap though the platform allows more; a large plan may go above the
    platform's; a tenant without a cap keeps the platform's."""
    context = make_context(tmp_path / "data", api={"max_upload_bytes": 1000})
    try:
        api = Api(context)
        small = context.tenants.create("small-plan", max_upload_bytes=100)
        large = context.tenants.create("large-plan", max_upload_bytes=5000)
        who = {t.name: TenantKey(t.id, context.tenants.create_key(t.id)[1]) for t in (small, large)}
        r = api.create(size_bytes=101, who=who["small-plan"])
        assert r.status_code == 413 and "upload limit of 100 bytes" in r.json()["detail"]
        assert api.create(size_bytes=100, who=who["small-plan"]).status_code == 201
        assert api.create(size_bytes=5000, who=who["large-plan"]).status_code == 201
        assert api.create(size_bytes=5001, who=who["large-plan"]).status_code == 413
        assert api.create(size_bytes=1001).status_code == 413
        with pytest.raises(InvalidInput, match="max_upload_bytes"):
            context.tenants.create("broken-plan", max_upload_bytes=0)
        with context.engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(assets)).scalar_one() == 2
    finally:
        context.close()


# --- U5: processed bytes are the validated bytes -----------------------------------------------------------


def test_u5_upload_url_reused_after_validation_changes_nothing_processed(api: Api, hostile: dict[str, bytes]) -> None:
    good = hostile["image.png"]
    created = api.create(good, filename="a.png", content_type="image/png").json()
    assert api.upload(created, good).status_code in (200, 204)
    asset = api.complete(created["id"]).json()
    assert asset["status"] == "READY"
    session = api.row(upload_sessions, asset_id=uuid.UUID(created["id"]))
    key = api.object_key(created["id"])
    assert key != session.object_key and key in _published(api, created["id"])
    # the same URL again, now with hostile bytes: fs refuses, S3 (moto, and real S3 until expiry) accepts
    evil = b"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>"
    replay = api.upload(created, evil)
    assert replay.status_code == (409 if api.ctx.storage.kind == "fs" else 204)
    with api.ctx.storage.open_read(key) as f:
        assert hashlib.sha256(f.read()).hexdigest() == asset["sha256"] == hashlib.sha256(good).hexdigest()
    if api.ctx.storage.kind == "s3":  # the policy only ever names the staging key, never the published one
        assert created["upload"]["fields"]["key"] == session.object_key != key


def test_u5_object_swapped_during_validation_is_not_what_gets_published(
    api: Api, hostile: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PUT that lands after the download and before the verdict (the TOCTOU window) is simply ignored."""
    good, store = hostile["clip.mp4"], api.ctx.storage
    created = api.create(good).json()
    api.upload(created, good)
    staging = api.row(upload_sessions, asset_id=uuid.UUID(created["id"])).object_key
    download = store.download_to

    def download_then_swap(key: str, path: Path) -> int:
        size = download(key, path)
        store.put_stream(key, [b"\x00" * len(good)], "video/mp4", max_bytes=len(good))  # same size, other bytes
        return size

    monkeypatch.setattr(store, "download_to", download_then_swap)
    asset = api.complete(created["id"]).json()
    assert asset["status"] == "READY" and asset["sha256"] == hashlib.sha256(good).hexdigest()
    with store.open_read(api.object_key(created["id"])) as f:
        assert f.read() == good
    assert store.head(staging) is None  # the swapped staging object is not kept either


# --- U25: one validation per asset --------------------------------------------------------------------------


def test_u25_concurrent_complete_runs_a_single_validation(
    api: Api, hostile: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = hostile["clip.mp4"]
    created = api.create(data).json()
    api.upload(created, data)
    service: AssetService = api.ctx.assets
    validator, calls = service._validator, []
    entered, release = threading.Event(), threading.Event()
    real = validator.validate

    def gated(*args: Any) -> Any:
        calls.append(args[0].id)
        entered.set()
        assert release.wait(30)
        return real(*args)

    monkeypatch.setattr(validator, "validate", gated)
    first: list[Any] = []
    worker = threading.Thread(target=lambda: first.append(api.complete(created["id"]).json()))
    worker.start()
    try:
        assert entered.wait(30)
        second = api.complete(created["id"])  # while the first is validating
        assert second.status_code == 200 and second.json()["status"] == "VALIDATING"
    finally:
        release.set()
        worker.join(30)
    assert first[0]["status"] == "READY"
    assert api.complete(created["id"]).json() == first[0]  # replay after the verdict
    assert len(calls) == 1


def test_u25_a_dead_validators_claim_is_taken_over_after_its_ttl(api: Api, hostile: dict[str, bytes]) -> None:
    data = hostile["clip.mp4"]
    created = api.create(data).json()
    api.upload(created, data)
    clock: FakeClock = api.ctx.clock  # type: ignore[assignment]
    claim = {"upload": {"filename": "clip.mp4"}, "validation": {"started_at": clock.now().isoformat()}}
    with api.ctx.engine.begin() as conn:  # as left by a process that died mid-validation
        conn.execute(
            assets.update().where(assets.c.id == uuid.UUID(created["id"])).values(status="VALIDATING", probe=claim)
        )
    assert api.complete(created["id"]).json()["status"] == "VALIDATING"  # still within the claim's lifetime
    clock.advance(api.ctx.assets._claim_ttl_s + 1)
    assert api.complete(created["id"]).json()["status"] == "READY"


# --- U30: presign rate limit per tenant -------------------------------------------------------------------


def test_u30_presign_rate_limit_is_per_tenant(api: Api) -> None:
    """The context allows 5 upload sessions per tenant per minute (limits.uploads_per_tenant_per_min)."""
    clock: FakeClock = api.ctx.clock  # type: ignore[assignment]
    assert [api.create(size_bytes=10).status_code for _ in range(5)] == [201] * 5
    limited = api.create(size_bytes=10)
    assert limited.status_code == 429 and limited.headers["content-type"] == "application/problem+json"
    assert limited.json()["type"].endswith("/rate-limited") and 1 <= int(limited.headers["retry-after"]) <= 60
    bob = tenant_with_key(api.ctx, "bob")
    assert api.create(size_bytes=10, who=bob).status_code == 201  # other tenants are unaffected
    clock.advance(61)
    assert api.create(size_bytes=10).status_code == 201  # the window slides


# --- U22 / U23: multipart ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "parts"),
    [
        (12 * MIB, 4),  # > size / 5 MiB + 1 = 3
        (12 * MIB, 0),
        (2 * 1024 * MIB, 10_001),  # > S3's 10,000 (and > 410 by size)
        (10, 2),
    ],
)
def test_u22_multipart_part_count_is_checked_at_initiate(s3api: Api, size: int, parts: int) -> None:
    r = s3api.create(size_bytes=size, parts=parts)
    assert r.status_code == 400 and r.headers["content-type"] == "application/problem+json"
    assert "parts must be between 1 and" in r.json()["detail"] and r.json()["field"] == "parts"
    client = s3api.ctx.storage._client  # type: ignore[attr-defined]
    assert client.list_multipart_uploads(Bucket=s3api.ctx.storage.bucket).get("Uploads", []) == []


def test_u22_multipart_needs_the_s3_store(local: Api) -> None:
    r = local.create(size_bytes=10, parts=1)
    assert r.status_code == 422 and "s3 store" in r.json()["detail"]


def test_u22_multipart_upload_completes_from_the_parts_s3_recorded(s3api: Api, hostile: dict[str, bytes]) -> None:
    data = hostile["clip.mp4"]
    created = s3api.create(data, parts=1).json()
    upload = created["upload"]
    assert upload["url"] is None and len(upload["part_urls"]) == 1
    r = s3api.complete(created["id"])
    assert r.status_code == 422 and "multipart upload incomplete" in r.json()["detail"]
    assert httpx.put(upload["part_urls"][0], content=data, timeout=10).status_code == 200
    asset = s3api.complete(created["id"]).json()
    assert asset["status"] == "READY" and asset["sha256"] == hashlib.sha256(data).hexdigest()

    gap = s3api.create(size_bytes=6 * MIB, parts=2).json()  # part 2 without part 1: not complete
    assert httpx.put(gap["upload"]["part_urls"][1], content=b"x" * MIB, timeout=10).status_code == 200
    r = s3api.complete(gap["id"])
    assert r.status_code == 422 and s3api.get(gap["id"]).json()["status"] == "UPLOADING"


def test_u23_abandoned_uploads_are_expired_and_their_multipart_aborted(s3api: Api) -> None:
    store, clock = s3api.ctx.storage, s3api.ctx.clock
    client = store._client  # type: ignore[attr-defined]
    multipart = s3api.create(size_bytes=6 * MIB, parts=2).json()
    assert httpx.put(multipart["upload"]["part_urls"][0], content=b"x" * 5 * MIB, timeout=30).status_code == 200
    single = s3api.create(b"y" * 100).json()
    s3api.upload(single, b"y" * 100)
    clock.advance(86_400 + 900 + 1)  # upload URLs (900 s) expired a day ago
    fresh = s3api.create(b"z" * 10).json()
    staging = {
        a["id"]: s3api.row(upload_sessions, asset_id=uuid.UUID(a["id"])).object_key for a in (multipart, single, fresh)
    }
    assert any(
        u["Key"] == staging[multipart["id"]]
        for u in client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
    )

    assert s3api.ctx.assets.expire_abandoned_uploads() == 2
    for asset in (multipart, single):
        view = s3api.get(asset["id"]).json()
        assert view["status"] == "REJECTED" and "abandoned" in view["error"]
        assert s3api.row(upload_sessions, asset_id=uuid.UUID(asset["id"])).status == "EXPIRED"
        assert store.head(staging[asset["id"]]) is None
    assert not any(
        u["Key"] == staging[multipart["id"]]
        for u in client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
    )
    assert s3api.get(fresh["id"]).json()["status"] == "UPLOADING"
    assert s3api.ctx.assets.expire_abandoned_uploads() == 0  # idempotent


def test_u23_bucket_rule_aborts_incomplete_multipart_after_a_day(s3api: Api) -> None:
    store = s3api.ctx.storage
    client = store._client  # type: ignore[attr-defined]
    other = {"ID": "operator-rule", "Status": "Enabled", "Filter": {"Prefix": "logs/"}, "Expiration": {"Days": 30}}
    client.put_bucket_lifecycle_configuration(Bucket=store.bucket, LifecycleConfiguration={"Rules": [other]})
    try:
        store.ensure_multipart_lifecycle(days=1)  # type: ignore[attr-defined]
        store.ensure_multipart_lifecycle(days=1)  # type: ignore[attr-defined]
        rules = client.get_bucket_lifecycle_configuration(Bucket=store.bucket)["Rules"]
        ours = [r for r in rules if r["ID"] == "aivedio-abort-incomplete-multipart"]
        assert len(ours) == 1 and ours[0]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 1}
        assert any(r["ID"] == "operator-rule" for r in rules)  # merged, not replaced
    finally:
        client.delete_bucket_lifecycle(Bucket=store.bucket)


# --- U29: Content-Encoding on upload ---------------------------------------------------------------------


def test_u29_fs_upload_with_content_encoding_is_refused(local: Api, hostile: dict[str, bytes]) -> None:
    data = gzip.compress(hostile["clip.mp4"])
    created = local.create(data).json()
    r = local.client.put(created["upload"]["url"], content=data, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 415 and r.json()["type"].endswith("/unsupported-media-type")
    assert local.ctx.storage.head(local.object_key(created["id"])) is None
    ok = local.client.put(created["upload"]["url"], content=data, headers={"Content-Encoding": "identity"})
    assert ok.status_code == 200 and ok.json()["sha256"] == hashlib.sha256(data).hexdigest()  # stored as sent


def test_u29_s3_content_encoding_is_not_carried_to_the_validated_object(s3api: Api, hostile: dict[str, bytes]) -> None:
    data = hostile["clip.mp4"]
    created = s3api.create(data).json()
    target = created["upload"]
    files = {"file": ("clip.mp4", data, "video/mp4")}
    r = httpx.post(target["url"], data={**target["fields"], "Content-Encoding": "gzip"}, files=files, timeout=10)
    assert r.status_code == 204  # moto ignores the policy; real S3 refuses a field the policy does not list
    client, bucket = s3api.ctx.storage._client, s3api.ctx.storage.bucket  # type: ignore[attr-defined]
    staging = s3api.object_key(created["id"])
    assert client.head_object(Bucket=bucket, Key=staging).get("ContentEncoding") == "gzip"
    asset = s3api.complete(created["id"]).json()
    assert asset["status"] == "READY"
    head = client.head_object(Bucket=bucket, Key=s3api.object_key(created["id"]))
    assert "ContentEncoding" not in head and head["ContentType"] == "video/mp4"


# --- U10 / U11: originals are downloads, never rendered -----------------------------------------------------


def test_u10_u11_polyglot_original_is_only_ever_an_attachment(api: Api, hostile: dict[str, bytes]) -> None:
    """A valid mp4 with ZIP + HTML appended passes upload validation (ffprobe reads the mp4); what keeps the
    HTML inert is how originals are served. Serving only derivatives (U11) is the media pipeline's part."""
    data = hostile["polyglot.mp4"]
    asset = api.submit(data, filename="x.html")
    assert asset["status"] == "READY"
    url = api.ctx.storage.signed_get_url(api.object_key(asset["id"]), 60, filename="x.html")
    r = api.client.get(url) if url.startswith("/") else httpx.get(url, timeout=10)
    assert r.status_code == 200 and r.content == data
    assert r.headers["content-disposition"].startswith("attachment")
    assert r.headers["content-type"] == "video/mp4"
    if api.ctx.storage.kind == "fs":  # S3 cannot add this header itself: a CDN response-header policy must
        assert r.headers["x-content-type-options"] == "nosniff"


# --- U27 / U28: resource bombs in the probe sandbox --------------------------------------------------------


_RSS_PROBE = """
import resource, sys
from pathlib import Path
from aivedio_engine.media.probe import MediaLimits, ProbeError, probe_file
try:
    probe_file(Path(sys.argv[1]), "image", MediaLimits(max_pixels=10**9, memory_limit_bytes=512 * 2**20,
                                                          timeout_s=30))
except ProbeError:
    pass
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def test_u28_memory_bomb_is_bounded_by_the_sandbox_not_by_luck(tmp_path: Path, hostile: dict[str, bytes]) -> None:
    """With -max_pixels lifted, only the address-space limit stands between ffprobe and a 1 GB decode of the
    16000² PNG (1,054 MB RSS measured unbounded): the child must stay under the 512 MiB cap."""
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(hostile["png16k"])
    out = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(bomb)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert int(out.stdout.strip().splitlines()[-1]) * 1024 < 512 * 2**20


@pytest.mark.parametrize(
    ("script", "reasons"),
    [
        ("echo 'Cannot allocate memory' >&2; exit 69", ("Cannot allocate memory",)),  # ENOMEM under prlimit --as
        # CPU bomb: whichever fires first, the wall-clock kill or prlimit's soft CPU limit (SIGXCPU; the hard limit's
        # SIGKILL is a CPU-second later, so after the wall-clock timeout)
        ("while :; do :; done", ("timed out", "killed by SIGXCPU")),
        ("kill -9 $$", ("killed by SIGKILL",)),  # the OOM killer
    ],
)
def test_u27_u28_resource_kills_are_media_rejections_made_once(
    tmp_path: Path, script: str, reasons: tuple[str, ...], hostile: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe that dies of a resource limit rejects the upload (non-retryable: the bytes are at fault), in
    one attempt: a replayed complete() does not run the probe again, and the process serving it survives."""
    fake = tmp_path / "bin" / "ffprobe"
    fake.parent.mkdir()
    runs = tmp_path / "runs"
    fake.write_text(f"#!/bin/sh\necho run >> {runs}\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    context = make_context(tmp_path / "data", media={"timeout_s": 1})
    try:
        api = Api(context)
        asset = api.submit(hostile["clip.mp4"])
        replay = api.complete(asset["id"]).json()
    finally:
        context.close()
    assert asset["status"] == "REJECTED" and any(r in asset["error"] for r in reasons), asset["error"]
    assert replay == asset and runs.read_text().count("run") == 1
