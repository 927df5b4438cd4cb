"""System B with the S3 object store (moto server mode): the `photo_story` steps read and write S3, and the
per-shot `clip` step hands its shot to a generation task, which needs an input asset upload. That upload was made
by replaying the fs store's signed-URL path in-process, which S3 does not have (its target is a presigned S3
request), so every clip step failed with S3; the engine's own process now writes the upload through the asset
service whatever the store."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest

from aivedio_engine import embedded
from aivedio_engine.bootstrap import build_context
from aivedio_engine.client import EmbeddedClient
from aivedio_engine.config import load_settings
from aivedio_engine.domain.workflow import StepStatus
from aivedio_engine.services.errors import NotFound
from aivedio_engine.services.tenants import Principal
from aivedio_engine.storage.s3 import S3Store
from aivedio_engine.worker.runtime import Runtime
from aivedio_engine.workflows import catalog
from tests.support.moto import MotoS3

PHOTO = Path(__file__).resolve().parents[2] / "examples" / "photo_story" / "photo.png"

pytestmark = pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg")


def test_embedded_upload_lands_in_s3_and_is_validated(tmp_path: Path, moto_s3: MotoS3) -> None:
    ctx = build_context(load_settings(None, {"data_dir": str(tmp_path), "storage": moto_s3.storage_settings()}))
    try:
        assert isinstance(ctx.storage, S3Store)
        principal = embedded.prepare(ctx)
        asset_id = EmbeddedClient(ctx, principal).upload(PHOTO)
        asset = ctx.assets.get(principal, asset_id)
        assert asset.status == "READY" and asset.size_bytes == PHOTO.stat().st_size
        key = ctx.workflows.input_image_key(principal.tenant_id, asset_id)
        body = moto_s3.client().get_object(Bucket=moto_s3.bucket, Key=key)["Body"].read()
        assert body == PHOTO.read_bytes()
        # another tenant cannot write into this tenant's upload
        other = Principal(ctx.tenants.create("other").id, uuid.uuid4())
        view, _ = ctx.assets.create_upload(principal, "x.png", 10, "image/png")
        with pytest.raises(NotFound):
            ctx.assets.write_upload(other, view.id, [b"0123456789"])
    finally:
        ctx.close()


def test_photo_story_runs_with_the_s3_store(tmp_path: Path, moto_s3: MotoS3) -> None:
    ctx = build_context(load_settings(None, {"data_dir": str(tmp_path), "storage": moto_s3.storage_settings()}))
    try:
        principal = embedded.prepare(ctx)
        photo = EmbeddedClient(ctx, principal).upload(PHOTO)
        project, _ = ctx.workflows.create(
            principal.tenant_id,
            "photo_story",
            user_ref="s3",
            input={catalog.PHOTO_INPUT: photo, "script": "Hello there."},
        )
        runtime = Runtime(ctx, embedded.BACKGROUND_ROLES, threading.Event())
        runtime.start()
        try:
            deadline = time.monotonic() + 240
            while (view := ctx.workflows.get(project.id)).project.status.value not in {
                "succeeded",
                "failed",
                "cancelled",
                "needs_attention",
            }:
                assert time.monotonic() < deadline, [(s.step_key, s.status, s.error_message) for s in view.steps]
                time.sleep(0.2)
        finally:
            runtime.shutdown()
    finally:
        ctx.close()

    steps = {s.step_key: s for s in view.steps}
    problems = {k: (s.status, s.error_code, s.error_message) for k, s in steps.items() if s.status != "success"}
    assert view.project.status.value == "succeeded", problems
    clip = steps["clip[0]"]
    assert clip.status is StepStatus.SUCCESS and clip.generation_task_id is not None
    # the clip, the shot and the delivered MP4 are S3 objects; nothing was written under the data dir's fs store
    listed = moto_s3.client().list_objects_v2(Bucket=moto_s3.bucket, Prefix=f"workflows/{project.id}/")
    stored = {o["Key"] for o in listed.get("Contents", [])}
    assert steps["delivery"].output_json is not None
    assert steps["delivery"].output_json["key"] in stored
    assert any(k.endswith("/shot.png") for k in stored), stored
    assert not (tmp_path / "objects").exists()
