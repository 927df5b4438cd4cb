"""S3-compatible object store via boto3 (distributed mode; tested against moto server).

`put_stream` spools to a local temp file while hashing and counting, then uploads with metadata
`x-amz-meta-sha256`: S3 metadata must be sent before the body, and the digest is only known at the end, so the
alternative (multipart, then a server-side copy to attach metadata) costs a second full copy in the bucket and
fails above 5 GiB. Spooling keeps memory flat; the upload is atomic (an object appears only when PUT or
CompleteMultipartUpload succeeds), and a stream over the cap never reaches S3 at all.

Client uploads use presigned POST, because only a POST policy can pin the size (presigned PUT cannot, boto3
#2837): the policy holds the exact key (boto3 adds `{"key": key}` when the key has no `${filename}`), a
content-length-range of exactly the declared size and the exact Content-Type. Emulators do not enforce these
, so `AssetService.complete()` re-checks size, checksum and content regardless.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError

from aivedio_engine.clock import Clock, SystemClock
from aivedio_engine.storage.base import (
    CompletedPart,
    HashingCounter,
    ListedObject,
    ObjectNotFound,
    StoredObject,
    StoreError,
    UploadTarget,
    content_disposition,
    readable_key,
    validate_prefix,
)
from aivedio_engine.storage.keys import validate_key

#: S3's published multipart limits
MAX_PARTS = 10_000
MIN_PART_BYTES = 5 * 1024 * 1024
ABORT_RULE_ID = "aivedio-abort-incomplete-multipart"
_MISSING = {"404", "NoSuchKey", "NotFound", "NoSuchUpload"}
#: one botocore session per process: loading the service model once makes every later client cheap
_SESSION: boto3.session.Session | None = None
_SESSION_LOCK = threading.Lock()


def _session() -> boto3.session.Session:
    global _SESSION
    if _SESSION is None:
        _SESSION = boto3.session.Session()
    return _SESSION


def _missing(exc: Exception) -> bool:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", "")) in _MISSING


class S3Store:
    kind = "s3"

    def __init__(
        self,
        client: Any,
        bucket: str,
        *,
        spool_dir: Path,
        part_bytes: int = 8 * 1024 * 1024,
        clock: Clock | None = None,
        encryption: str = "",
        kms_key_id: str = "",
    ) -> None:
        self._client = client
        self.bucket = bucket
        self._spool_dir = Path(spool_dir)
        self._part_bytes = max(part_bytes, MIN_PART_BYTES)
        self._transfer = TransferConfig(multipart_threshold=self._part_bytes, multipart_chunksize=self._part_bytes)
        self._clock = clock or SystemClock()
        # server-side encryption asked on every write: PUT, multipart and the client's POST
        self._sse: dict[str, str] = {}
        if encryption:
            self._sse["ServerSideEncryption"] = encryption
            if kms_key_id:
                self._sse["SSEKMSKeyId"] = kms_key_id

    @classmethod
    def client_from(cls, endpoint_url: str, region: str, access_key_id: str, secret_access_key: str) -> Any:
        s3_options = {"addressing_style": "path"} if endpoint_url else {}
        config = Config(
            signature_version="s3v4",
            s3=s3_options,
            connect_timeout=5,
            read_timeout=60,
            retries={"max_attempts": 3, "mode": "standard"},
        )
        with _SESSION_LOCK:  # a boto3 Session is not thread-safe; the clients it makes are
            return _session().client(
                "s3",
                endpoint_url=endpoint_url or None,
                region_name=region,
                # empty means "use the default credential chain" (environment, instance role)
                aws_access_key_id=access_key_id or None,
                aws_secret_access_key=secret_access_key or None,
                config=config,
            )

    # --- objects -----------------------------------------------------------------------------------------

    def put_stream(self, key: str, chunks: Iterable[bytes], content_type: str, max_bytes: int) -> StoredObject:
        validate_key(key)
        self._spool_dir.mkdir(parents=True, exist_ok=True)
        counter = HashingCounter(max_bytes)
        with tempfile.TemporaryFile(dir=self._spool_dir) as spool:
            for chunk in counter.feed(chunks):
                spool.write(chunk)
            spool.seek(0)
            self._client.upload_fileobj(
                spool,
                self.bucket,
                key,
                Config=self._transfer,
                ExtraArgs={"ContentType": content_type, "Metadata": {"sha256": counter.hexdigest}, **self._sse},
            )
        return StoredObject(key, counter.size, counter.hexdigest, content_type)

    def head(self, key: str) -> StoredObject | None:
        try:
            resp = self._client.head_object(Bucket=self.bucket, Key=validate_key(key))
        except ClientError as exc:
            if _missing(exc):
                return None
            raise
        sha = (resp.get("Metadata") or {}).get("sha256")
        return StoredObject(key, int(resp["ContentLength"]), sha, resp.get("ContentType"))

    def open_read(self, key: str) -> IO[bytes]:
        try:
            body: IO[bytes] = self._client.get_object(Bucket=self.bucket, Key=validate_key(key))["Body"]
            return body
        except ClientError as exc:
            if _missing(exc):
                raise ObjectNotFound(key) from None
            raise

    def download_to(self, key: str, path: Path) -> int:
        try:
            self._client.download_file(self.bucket, validate_key(key), str(path), Config=self._transfer)
        except ClientError as exc:
            if _missing(exc):
                raise ObjectNotFound(key) from None
            raise
        return os.path.getsize(path)

    def delete(self, key: str) -> None:
        self._client.delete_object(Bucket=self.bucket, Key=validate_key(key))

    def iter_objects(self, prefix: str = "", start_after: str | None = None) -> Iterator[ListedObject]:
        """ListObjectsV2 page by page (1,000 keys a request). In-progress multipart uploads are not objects yet
        and are not listed; the bucket's abort rule (`ensure_multipart_lifecycle`) is what reclaims them."""
        args: dict[str, Any] = {"Bucket": self.bucket, "Prefix": validate_prefix(prefix)}
        if start_after:
            args["StartAfter"] = start_after
        pages = self._client.get_paginator("list_objects_v2").paginate(**args)
        for page in pages:
            for item in page.get("Contents", ()):
                yield ListedObject(str(item["Key"]), int(item["Size"]), item["LastModified"].astimezone(UTC))

    # --- presigning (local computation, no network) ------------------------------------------------------

    def signed_get_url(self, key: str, ttl_s: int, filename: str | None = None, *, now: datetime | None = None) -> str:
        """`now` is accepted for interface parity; SigV4 presigning always uses the real clock."""
        params = {
            "Bucket": self.bucket,
            "Key": readable_key(key),
            "ResponseContentDisposition": content_disposition(filename),
        }
        return self._client.generate_presigned_url("get_object", Params=params, ExpiresIn=int(ttl_s))

    def upload_target(
        self, key: str, size_bytes: int, content_type: str, ttl_s: int, *, upload_id: str, now: datetime | None = None
    ) -> UploadTarget:
        fields = {"Content-Type": content_type, **self._sse_fields()}
        post = self._client.generate_presigned_post(
            Bucket=self.bucket,
            Key=validate_key(key),
            Fields=fields,
            Conditions=[*({k: v} for k, v in fields.items()), ["content-length-range", size_bytes, size_bytes]],
            ExpiresIn=int(ttl_s),
        )
        return UploadTarget(
            method="POST",
            url=post["url"],
            fields=dict(post["fields"]),
            headers={},
            expires_at=(now or self._clock.now()) + timedelta(seconds=int(ttl_s)),
        )

    def _sse_fields(self) -> dict[str, str]:
        # the POST form's spelling of the same headers; the policy pins them, so a client cannot drop them
        names = {
            "ServerSideEncryption": "x-amz-server-side-encryption",
            "SSEKMSKeyId": "x-amz-server-side-encryption-aws-kms-key-id",
        }
        return {names[k]: v for k, v in self._sse.items()}

    # --- multipart ---------------------------------------------------------------------------------------

    def create_multipart(self, key: str, content_type: str) -> str:
        resp = self._client.create_multipart_upload(
            Bucket=self.bucket, Key=validate_key(key), ContentType=content_type, **self._sse
        )
        return str(resp["UploadId"])

    def presign_parts(self, key: str, upload_id: str, part_count: int, ttl_s: int) -> list[str]:
        if not 1 <= part_count <= MAX_PARTS:
            raise StoreError(f"part count must be 1..{MAX_PARTS}, got {part_count}")
        validate_key(key)
        return [
            self._client.generate_presigned_url(
                "upload_part",
                Params={"Bucket": self.bucket, "Key": key, "UploadId": upload_id, "PartNumber": n},
                ExpiresIn=int(ttl_s),
            )
            for n in range(1, part_count + 1)
        ]

    def complete_multipart(self, key: str, upload_id: str, parts: list[CompletedPart]) -> StoredObject:
        ordered = sorted(parts, key=lambda p: p.part_number)
        self._client.complete_multipart_upload(
            Bucket=self.bucket,
            Key=validate_key(key),
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": p.part_number, "ETag": p.etag} for p in ordered]},
        )
        stored = self.head(key)
        if stored is None:
            raise StoreError(f"multipart upload of {key} completed but the object is missing")
        return stored

    def complete_uploaded_parts(self, key: str, upload_id: str) -> StoredObject:
        """Complete a client-driven multipart upload from the parts S3 itself recorded (ListParts), so the
        client never has to be trusted with ETags. Parts must run 1..n without gaps: a hole means the client
        has not finished, and completing would silently drop the missing bytes."""
        parts: list[CompletedPart] = []
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": validate_key(key), "UploadId": upload_id}
        while True:
            try:
                page = self._client.list_parts(**kwargs)
            except ClientError as exc:
                if _missing(exc):
                    raise ObjectNotFound(key) from None
                raise
            parts += [CompletedPart(int(p["PartNumber"]), str(p["ETag"])) for p in page.get("Parts", ())]
            if not page.get("IsTruncated"):
                break
            kwargs["PartNumberMarker"] = page["NextPartNumberMarker"]
        numbers = sorted(p.part_number for p in parts)
        if not numbers or numbers != list(range(1, len(numbers) + 1)):
            raise ObjectNotFound(f"{key}: parts {numbers[:5]}... are not 1..n")
        return self.complete_multipart(key, upload_id, parts)

    def ensure_multipart_lifecycle(self, days: int = 1) -> None:
        """Bucket rule that aborts incomplete multipart uploads after `days` (U23): the
        backstop for uploads whose session row is gone. Merged by rule ID, keeping the operator's rules."""
        rule = {
            "ID": ABORT_RULE_ID,
            "Status": "Enabled",
            "Filter": {"Prefix": "tenants/"},
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": int(days)},
        }
        try:
            rules = self._client.get_bucket_lifecycle_configuration(Bucket=self.bucket).get("Rules", [])
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) != "NoSuchLifecycleConfiguration":
                raise
            rules = []
        rules = [r for r in rules if r.get("ID") != ABORT_RULE_ID] + [rule]
        self._client.put_bucket_lifecycle_configuration(Bucket=self.bucket, LifecycleConfiguration={"Rules": rules})

    def abort_multipart(self, key: str, upload_id: str) -> None:
        try:
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=validate_key(key), UploadId=upload_id)
        except ClientError as exc:
            if not _missing(exc):
                raise
