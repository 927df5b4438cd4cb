"""Object storage: one Protocol (`base.ObjectStore`), a local-directory store and an S3 store."""

from __future__ import annotations

from pathlib import Path

from aivedio_engine.clock import Clock
from aivedio_engine.config import Settings
from aivedio_engine.storage.base import ObjectStore


def build_store(settings: Settings, clock: Clock | None = None) -> ObjectStore:
    cfg = settings.storage
    if cfg.kind == "s3":
        from aivedio_engine.storage.s3 import S3Store  # boto3 is only loaded when S3 is configured

        client = S3Store.client_from(
            cfg.endpoint_url, cfg.region, cfg.access_key_id.get_secret_value(), cfg.secret_access_key.get_secret_value()
        )
        return S3Store(
            client,
            cfg.bucket,
            spool_dir=Path(settings.data_dir) / "spool",
            part_bytes=cfg.multipart_part_bytes,
            clock=clock,
            encryption=cfg.server_side_encryption,
            kms_key_id=cfg.sse_kms_key_id,
        )
    from aivedio_engine.storage.fs import FsStore, load_signing_key

    root = Path(cfg.root) if cfg.root else Path(settings.data_dir) / "objects"
    key = load_signing_key(cfg.signing_key.get_secret_value(), Path(settings.data_dir))
    return FsStore(root, key, bucket=cfg.bucket, public_base_url=settings.api.public_base_url, clock=clock)


__all__ = ["ObjectStore", "build_store"]
