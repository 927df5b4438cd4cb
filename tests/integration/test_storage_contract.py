"""One contract for every object store: local directory (fs) and S3 (moto server), built by `build_store`.

Signed URLs are fetched the way a client would: fs URLs through the real API app (which serves them), S3 URLs
over HTTP from the moto server. moto accepts expired and tampered presigned URLs and ignores POST policies
, so for S3 those properties are checked on the generated URL/policy instead.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient

from aivedio_engine.api.app import create_app
from aivedio_engine.bootstrap import build_context
from aivedio_engine.clock import new_id
from aivedio_engine.config import Settings, load_settings
from aivedio_engine.storage import build_store
from aivedio_engine.storage.base import CompletedPart, ObjectNotFound, ObjectStore, ObjectTooLarge
from aivedio_engine.storage.keys import InvalidKey
from tests.support.moto import MotoS3

DATA = [os.urandom(70_000), os.urandom(1), os.urandom(130_001)]
BLOB = b"".join(DATA)


class Harness:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store: ObjectStore = build_store(settings)
        self._client: TestClient | None = None

    def fetch(self, url: str) -> httpx.Response:
        if url.startswith("/"):  # fs: served by our own API
            if self._client is None:
                self._client = TestClient(create_app(build_context(self.settings)))
            return self._client.get(url)
        return httpx.get(url, timeout=10)


@pytest.fixture(scope="module", params=["fs", "s3"])
def h(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Harness:
    """One store per implementation for the module: every test uses fresh random keys."""
    values: dict[str, Any] = {"data_dir": str(tmp_path_factory.mktemp(request.param))}
    if request.param == "s3":
        values["storage"] = request.getfixturevalue("moto_s3").storage_settings()
    return Harness(load_settings(None, values))


def key() -> str:
    return f"tenants/{new_id()}/assets/{new_id()}/original.mp4"


def chunks_then_fail(parts: list[bytes]) -> Iterator[bytes]:
    yield from parts
    raise RuntimeError("producer died mid-stream")


def test_put_head_read_download_roundtrip(h: Harness, tmp_path: Path) -> None:
    k = key()
    stored = h.store.put_stream(k, iter(DATA), "video/mp4", max_bytes=len(BLOB))
    assert (stored.key, stored.size, stored.sha256) == (k, len(BLOB), hashlib.sha256(BLOB).hexdigest())
    head = h.store.head(k)
    assert head is not None and head.size == len(BLOB)
    assert head.sha256 == stored.sha256 and head.content_type == "video/mp4"  # we wrote it, so we know it
    with h.store.open_read(k) as f:
        assert f.read() == BLOB
    target = tmp_path / "copy.bin"
    assert h.store.download_to(k, target) == len(BLOB) and target.read_bytes() == BLOB


def test_size_cap_is_enforced_while_streaming_and_leaves_nothing(h: Harness) -> None:
    k = key()
    pulled: list[int] = []

    def producer() -> Iterator[bytes]:
        for i in range(10):
            pulled.append(i)
            yield b"x" * 100

    with pytest.raises(ObjectTooLarge):
        h.store.put_stream(k, producer(), "video/mp4", max_bytes=250)
    assert pulled == [0, 1, 2]  # stopped at the chunk that crossed the cap, not after draining the producer
    assert h.store.head(k) is None
    if h.store.kind == "fs":
        assert list((h.store.root / ".tmp").iterdir()) == []  # type: ignore[attr-defined]


def test_exact_cap_is_allowed_and_empty_objects_work(h: Harness) -> None:
    k = key()
    assert h.store.put_stream(k, [b"a" * 10], "video/mp4", max_bytes=10).size == 10
    assert h.store.put_stream(k + "0", [], "video/mp4", max_bytes=10).sha256 == hashlib.sha256(b"").hexdigest()


def test_overwrite_replaces_and_a_failed_write_keeps_the_old_object(h: Harness) -> None:
    """Overwrite policy: a completed put replaces the object; an aborted one leaves it untouched."""
    k = key()
    h.store.put_stream(k, [b"version-1"], "video/mp4", max_bytes=100)
    h.store.put_stream(k, [b"version-2!"], "video/mp4", max_bytes=100)
    with h.store.open_read(k) as f:
        assert f.read() == b"version-2!"
    with pytest.raises(RuntimeError):
        h.store.put_stream(k, chunks_then_fail([b"partial"]), "video/mp4", max_bytes=100)
    with pytest.raises(ObjectTooLarge):
        h.store.put_stream(k, [b"y" * 101], "video/mp4", max_bytes=100)
    head = h.store.head(k)
    assert head is not None and head.size == 10 and head.sha256 == hashlib.sha256(b"version-2!").hexdigest()
    with h.store.open_read(k) as f:
        assert f.read() == b"version-2!"


def test_missing_objects_and_idempotent_delete(h: Harness, tmp_path: Path) -> None:
    k = key()
    assert h.store.head(k) is None
    with pytest.raises(ObjectNotFound):
        h.store.open_read(k)
    with pytest.raises(ObjectNotFound):
        h.store.download_to(k, tmp_path / "x")
    h.store.delete(k)  # missing: not an error
    h.store.put_stream(k, [b"data"], "video/mp4", max_bytes=10)
    h.store.delete(k)
    assert h.store.head(k) is None
    h.store.delete(k)


def test_listing_streams_every_object_under_a_string_prefix(h: Harness) -> None:
    tenant, asset = new_id(), new_id()
    base = f"tenants/{tenant}/"
    written = {
        f"{base}assets/{asset}/original.mp4": b"o" * 70,
        f"{base}assets/{asset}/hls/v1/index.m3u8": b"#EXTM3U\n",
        f"{base}assets/{asset}/hls/v1/seg_000.m4s": b"s" * 1000,
        f"{base}tasks/{new_id()}/raw/{new_id()}/0.mp4": b"",
    }
    # S3 LastModified has whole seconds; file mtimes come from the kernel's coarse clock
    before = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    for k, data in written.items():
        h.store.put_stream(k, [data], "video/mp4", max_bytes=len(data))
    after = datetime.now(UTC)
    listed = {o.key: o for o in h.store.iter_objects(base)}
    assert {k: o.size_bytes for k, o in listed.items()} == {k: len(d) for k, d in written.items()}
    for o in listed.values():
        assert o.modified_at.tzinfo is not None and o.modified_at.utcoffset() == timedelta(0)
        assert before <= o.modified_at <= after
    # a prefix is a string prefix (S3 semantics), not only a directory
    assert {o.key for o in h.store.iter_objects(f"{base}assets/{str(asset)[:-3]}")} == {
        k for k in written if "/assets/" in k
    }
    assert {o.key for o in h.store.iter_objects(base[:-1])} == set(written)
    assert [o.key for o in h.store.iter_objects(f"{base}assets/{asset}/hls/v1/seg")] == [
        f"{base}assets/{asset}/hls/v1/seg_000.m4s"
    ]
    assert list(h.store.iter_objects(f"tenants/{new_id()}/")) == []
    h.store.delete(f"{base}assets/{asset}/original.mp4")
    assert len(list(h.store.iter_objects(base))) == 3
    assert set(written) - {f"{base}assets/{asset}/original.mp4"} <= {o.key for o in h.store.iter_objects()}


def test_an_object_is_listed_only_once_it_is_published(h: Harness) -> None:
    """A write in progress (fs: a temp file; s3: a local spool) is not an object yet, nor is an aborted one."""
    k = key()
    prefix = k.rsplit("/", 1)[0] + "/"
    seen: list[list[str]] = []

    def producer() -> Iterator[bytes]:
        yield b"x" * 100
        seen.append([o.key for o in h.store.iter_objects(prefix)])
        yield b"y"

    with pytest.raises(RuntimeError):
        h.store.put_stream(k, chunks_then_fail([b"partial"]), "video/mp4", max_bytes=100)
    assert list(h.store.iter_objects(prefix)) == []
    h.store.put_stream(k, producer(), "video/mp4", max_bytes=1000)
    assert seen == [[]]
    assert [(o.key, o.size_bytes) for o in h.store.iter_objects(prefix)] == [(k, 101)]


@pytest.mark.parametrize("bad", ["../", "/etc/", ".meta/", ".tmp", "a//", "a b/", "/"])
def test_listing_refuses_unsafe_prefixes(h: Harness, bad: str) -> None:
    with pytest.raises(InvalidKey):
        list(h.store.iter_objects(bad))


def test_fs_listing_skips_bookkeeping_and_does_not_follow_symlinks(tmp_path: Path) -> None:
    store = build_store(load_settings(None, {"data_dir": str(tmp_path / "data")}))
    root: Path = store.root  # type: ignore[attr-defined]
    k = key()
    store.put_stream(k, [b"data"], "video/mp4", max_bytes=10)
    (root / ".tmp" / "0123abcd").write_bytes(b"a crashed write")  # what a killed put_stream leaves behind
    (root / k).with_name(".DS_Store").write_bytes(b"litter")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.mp4").write_bytes(b"not ours")
    (root / "tenants" / "link").symlink_to(outside)
    (root / "tenants" / "file-link.mp4").symlink_to(outside / "secret.mp4")
    assert [o.key for o in store.iter_objects()] == [k]
    assert (root / ".meta" / f"{k}.json").exists()  # the sidecar is there, and not an object


@pytest.mark.parametrize("bad", ["../escape", "/etc/passwd", "a/../../b", ".meta/x", "a b", ""])
def test_every_operation_refuses_unsafe_keys(h: Harness, bad: str, tmp_path: Path) -> None:
    calls = [
        lambda: h.store.put_stream(bad, [b"x"], "video/mp4", max_bytes=10),
        lambda: h.store.head(bad),
        lambda: h.store.open_read(bad),
        lambda: h.store.download_to(bad, tmp_path / "x"),
        lambda: h.store.delete(bad),
        lambda: h.store.signed_get_url(bad, 60),
        lambda: h.store.upload_target(bad, 1, "video/mp4", 60, upload_id=str(new_id())),
    ]
    for call in calls:
        with pytest.raises(InvalidKey):
            call()


def test_signed_url_downloads_as_attachment_before_expiry(h: Harness) -> None:
    k = key()
    h.store.put_stream(k, [BLOB], "video/mp4", max_bytes=len(BLOB))
    r = h.fetch(h.store.signed_get_url(k, 60, filename="my clip é.mp4"))
    assert r.status_code == 200 and r.content == BLOB
    assert r.headers["content-disposition"].startswith("attachment")
    assert "UTF-8''my%20clip%20%C3%A9.mp4" in r.headers["content-disposition"]


def test_signed_url_stops_working_after_expiry(h: Harness) -> None:  # U4
    k = key()
    h.store.put_stream(k, [b"secret"], "video/mp4", max_bytes=10)
    if h.store.kind == "s3":
        # moto serves expired presigned URLs; assert the URL carries the expiry S3 enforces
        query = parse_qs(urlsplit(h.store.signed_get_url(k, 60)).query)
        assert query["X-Amz-Expires"] == ["60"] and query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
        return
    past = datetime.now(UTC) - timedelta(hours=2)
    assert h.fetch(h.store.signed_get_url(k, 60, now=past)).status_code == 403
    assert h.fetch(h.store.signed_get_url(k, 60)).status_code == 200


def test_fs_signatures_bind_key_method_expiry_and_filename(tmp_path: Path) -> None:
    h = Harness(load_settings(None, {"data_dir": str(tmp_path / "data")}))
    k, other = key(), key()
    for name in (k, other):
        h.store.put_stream(name, [b"tenant data"], "video/mp4", max_bytes=100)
    url = h.store.signed_get_url(k, 60, filename="a.mp4")
    assert h.fetch(url).status_code == 200
    assert h.fetch(url.replace(k, other)).status_code == 403  # path-tampered to another object (T8)
    assert h.fetch(url.replace("filename=a.mp4", "filename=b.html")).status_code == 403
    exp = parse_qs(urlsplit(url).query)["expires"][0]
    assert h.fetch(url.replace(f"expires={exp}", f"expires={int(exp) + 3600}")).status_code == 403
    assert h.fetch(url.replace("sig=", "sig=A")).status_code == 403
    assert h.fetch(url.split("?")[0]).status_code == 403
    # an upload signature is not a download signature
    target = h.store.upload_target(k, 11, "video/mp4", 60, upload_id=str(new_id()))
    sig = parse_qs(urlsplit(target.url).query)["sig"][0]
    assert h.fetch(f"/v1/objects/{k}?expires={exp}&sig={sig}").status_code == 403


def test_fs_signing_key_is_generated_once_private_and_reused(tmp_path: Path) -> None:
    settings = load_settings(None, {"data_dir": str(tmp_path / "data")})
    first, second = build_store(settings), build_store(settings)
    key_file = tmp_path / "data" / "signing.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and len(key_file.read_bytes()) == 32
    when = datetime(2030, 1, 1, tzinfo=UTC)
    assert first.signed_get_url("a/b", 60, now=when) == second.signed_get_url("a/b", 60, now=when)
    configured = build_store(
        load_settings(None, {"data_dir": str(tmp_path / "data"), "storage": {"signing_key": "x" * 40}})
    )
    assert configured.signed_get_url("a/b", 60, now=when) != first.signed_get_url("a/b", 60, now=when)


def test_fs_upload_target_is_a_signed_put_for_one_upload(tmp_path: Path) -> None:
    store = build_store(
        load_settings(None, {"data_dir": str(tmp_path / "data"), "api": {"public_base_url": "https://media.example/"}})
    )
    upload_id, now = str(new_id()), datetime.now(UTC)
    target = store.upload_target(key(), 123, "image/png", 900, upload_id=upload_id, now=now)
    assert target.method == "PUT" and target.headers == {"Content-Type": "image/png"} and target.fields == {}
    assert target.url.startswith(f"https://media.example/v1/uploads/{upload_id}?")
    assert target.expires_at is not None and target.expires_at <= now + timedelta(seconds=900)
    q = parse_qs(urlsplit(target.url).query)
    expires, sig = int(q["expires"][0]), q["sig"][0]
    assert store.verify("PUT", f"uploads/{upload_id}", expires, sig)  # type: ignore[attr-defined]
    assert not store.verify("PUT", f"uploads/{new_id()}", expires, sig)  # type: ignore[attr-defined]
    assert not store.verify("GET", f"uploads/{upload_id}", expires, sig)  # type: ignore[attr-defined]


def test_s3_presigned_post_policy_pins_key_size_and_type(moto_s3: MotoS3, tmp_path: Path) -> None:
    """moto does not enforce POST policies, so the policy document itself is the test (U3)."""
    store = build_store(load_settings(None, {"data_dir": str(tmp_path), "storage": moto_s3.storage_settings()}))
    k, before = key(), datetime.now(UTC)
    target = store.upload_target(k, 31_430, "video/mp4", 900, upload_id=str(new_id()))
    assert target.method == "POST" and target.url.rstrip("/").endswith(f"/{moto_s3.bucket}")
    assert target.fields["key"] == k and target.fields["Content-Type"] == "video/mp4"
    policy = json.loads(base64.b64decode(target.fields["policy"]))
    conditions = policy["conditions"]
    assert {"key": k} in conditions  # exact key...
    assert not any(isinstance(c, list) and c[:2] == ["starts-with", "$key"] for c in conditions)  # ...not a prefix
    assert ["content-length-range", 31_430, 31_430] in conditions
    assert {"Content-Type": "video/mp4"} in conditions and {"bucket": moto_s3.bucket} in conditions
    expiration = datetime.strptime(policy["expiration"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert before + timedelta(seconds=890) <= expiration <= datetime.now(UTC) + timedelta(seconds=900)
    # and the form really uploads to that key
    r = httpx.post(target.url, data=target.fields, files={"file": ("x.mp4", b"v" * 31_430, "video/mp4")})
    assert r.status_code in (200, 201, 204), r.text
    head = store.head(k)
    assert head is not None and head.size == 31_430 and head.sha256 is None  # a client wrote it: digest unknown


def test_s3_multipart_upload_with_presigned_parts(moto_s3: MotoS3, tmp_path: Path) -> None:
    store = build_store(load_settings(None, {"data_dir": str(tmp_path), "storage": moto_s3.storage_settings()}))
    k = key()
    parts = [os.urandom(5 * 1024 * 1024), os.urandom(1000)]
    upload_id = store.create_multipart(k, "video/mp4")  # type: ignore[attr-defined]
    urls = store.presign_parts(k, upload_id, len(parts), 900)  # type: ignore[attr-defined]
    done = []
    for n, (url, body) in enumerate(zip(urls, parts, strict=True), start=1):
        r = httpx.put(url, content=body, timeout=30)
        assert r.status_code == 200, r.text
        done.append(CompletedPart(n, r.headers["etag"]))
    stored = store.complete_multipart(k, upload_id, list(reversed(done)))  # type: ignore[attr-defined]
    assert stored.size == sum(map(len, parts))
    with store.open_read(k) as f:
        assert hashlib.sha256(f.read()).digest() == hashlib.sha256(b"".join(parts)).digest()
    aborted = store.create_multipart(key(), "video/mp4")  # type: ignore[attr-defined]
    store.abort_multipart(k, aborted)  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="part count"):
        store.presign_parts(k, upload_id, 10_001, 900)  # type: ignore[attr-defined]


@pytest.mark.parametrize("sse", [{"server_side_encryption": "AES256"}, {"server_side_encryption": "aws:kms"}])
def test_s3_server_side_encryption_is_asked_on_every_write(
    moto_s3: MotoS3, tmp_path: Path, sse: dict[str, str]
) -> None:
    """: the engine's PUT, a multipart upload and the client's POST form all carry the setting."""
    if sse["server_side_encryption"] == "aws:kms":
        sse = {**sse, "sse_kms_key_id": moto_s3.kms_key_id()}
    storage = {**moto_s3.storage_settings(), **sse}
    store = build_store(load_settings(None, {"data_dir": str(tmp_path), "storage": storage}))
    client = moto_s3.client()

    def encryption(k: str) -> tuple[str | None, str | None]:
        head = client.head_object(Bucket=moto_s3.bucket, Key=k)
        return head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")

    want = (sse["server_side_encryption"], sse.get("sse_kms_key_id"))
    put = key()
    store.put_stream(put, [b"x" * 100], "video/mp4", max_bytes=100)
    posted = key()
    target = store.upload_target(posted, 10, "video/mp4", 900, upload_id=str(new_id()))
    policy = json.loads(base64.b64decode(target.fields["policy"]))
    # moto ignores a POST form's encryption fields, so the form and its policy are the test for that path: the
    # field is in the form and pinned by the policy (S3 refuses a form that drops or changes it)
    assert target.fields["x-amz-server-side-encryption"] == want[0]
    assert {"x-amz-server-side-encryption": want[0]} in policy["conditions"]
    r = httpx.post(target.url, data=target.fields, files={"file": ("x.mp4", b"v" * 10, "video/mp4")})
    assert r.status_code in (200, 201, 204), r.text
    multi = key()
    upload_id = store.create_multipart(multi, "video/mp4")  # type: ignore[attr-defined]
    (url,) = store.presign_parts(multi, upload_id, 1, 900)  # type: ignore[attr-defined]
    part = httpx.put(url, content=b"m" * 1000, timeout=30)
    store.complete_multipart(multi, upload_id, [CompletedPart(1, part.headers["etag"])])  # type: ignore[attr-defined]
    assert [encryption(k)[0] for k in (put, multi)] == [want[0]] * 2
    if want[1]:
        assert [encryption(k)[1] for k in (put, multi)] == [want[1]] * 2


def test_a_kms_key_without_kms_encryption_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(Exception, match='server_side_encryption must be "aws:kms"'):
        load_settings(None, {"data_dir": str(tmp_path), "storage": {"kind": "s3", "sse_kms_key_id": "k"}})
