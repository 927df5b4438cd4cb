"""One S3 emulator per test session: moto's ThreadedMotoServer on a free loopback port, with a bucket.

Import the `moto_s3` fixture into a test module (`from tests.support.moto import moto_s3`). Several modules
may import it; they share one server, stopped when the session ends.

moto does NOT enforce presigned-POST policies, presigned-URL expiry or tampered keys (
): tests against it prove our own checks, never storage-side enforcement.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

BUCKET = "aivedio-test"
REGION = "us-east-1"
ACCESS_KEY = "testing"
SECRET_KEY = "testing"


@dataclass(frozen=True)
class MotoS3:
    endpoint_url: str
    bucket: str = BUCKET
    region: str = REGION

    def storage_settings(self) -> dict[str, Any]:
        """`storage` section overrides for `load_settings`, with explicit credentials so the default AWS
        credential chain (environment, ~/.aws, instance metadata) is never consulted."""
        return {
            "kind": "s3",
            "bucket": self.bucket,
            "endpoint_url": self.endpoint_url,
            "region": self.region,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
        }

    def kms_key_id(self) -> str:
        """A KMS key made on the same moto server (it serves every AWS API), for SSE-KMS tests."""
        return str(self.client("kms").create_key(Description="aivedio test")["KeyMetadata"]["KeyId"])

    def client(self, service: str = "s3") -> Any:
        import boto3

        return boto3.session.Session().client(
            service,  # type: ignore[call-overload]
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )


_shared: dict[str, MotoS3] = {}


@pytest.fixture(scope="session")
def moto_s3(request: pytest.FixtureRequest) -> Iterator[MotoS3]:
    if "s3" not in _shared:
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        s3 = MotoS3(f"http://{host}:{port}")
        s3.client().create_bucket(Bucket=s3.bucket)
        _shared["s3"] = s3

        def _stop() -> None:
            _shared.pop("s3", None)
            server.stop()

        request.session.config.add_cleanup(_stop)
    yield _shared["s3"]
