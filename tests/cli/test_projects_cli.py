"""`aivedio projects list|show|cancel|retry-step` on the embedded database, and `run`'s input errors."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine import embedded
from aivedio_engine.bootstrap import build_context
from aivedio_engine.config import load_settings
from aivedio_engine.domain.workflow import ErrorCode

runner = CliRunner()


def _cli(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["--set", f"data_dir={tmp_path}", *args])
    return result.exit_code, result.stdout, result.stderr


def _project_with_failed_photo(tmp_path: Path) -> uuid.UUID:
    """A project whose photo check failed for good (PHOTO_QUALITY_FAIL is not retried)."""
    ctx = build_context(load_settings(overrides={"data_dir": str(tmp_path)}))
    try:
        principal = embedded.prepare(ctx)
        project, _ = ctx.workflows.create(
            principal.tenant_id, "photo_story", user_ref="u1", input={"photo": "x", "script": "Hi."}
        )
        (step,) = ctx.workflows.claim(["photo_check"])
        ctx.workflows.report_failure(step.id, ErrorCode.PHOTO_QUALITY_FAIL, "too dark")
        return project.id
    finally:
        ctx.close()


def test_list_show_retry_step_and_cancel(tmp_path: Path) -> None:
    project_id = _project_with_failed_photo(tmp_path)

    code, out, _ = _cli(tmp_path, "projects", "list", "--json")
    assert code == 0 and [p["id"] for p in json.loads(out)] == [str(project_id)]
    assert json.loads(out)[0]["status"] == "failed"

    code, out, _ = _cli(tmp_path, "projects", "show", str(project_id), "--json")
    assert code == 0
    (step,) = json.loads(out)["steps"]
    assert (step["key"], step["status"], step["error_code"]) == ("photo_check", "failed", "PHOTO_QUALITY_FAIL")

    code, out, _ = _cli(tmp_path, "projects", "retry-step", str(project_id), "photo_check", "--reason", "new photo")
    assert code == 0 and "is pending" in out
    code, out, _ = _cli(tmp_path, "projects", "show", str(project_id), "--json")
    assert json.loads(out)["status"] == "running" and json.loads(out)["steps"][0]["status"] == "pending"
    # a pending step has nothing to retry: refused, one line
    code, _, err = _cli(tmp_path, "projects", "retry-step", str(project_id), "photo_check", "--reason", "again")
    assert code == 4 and err.startswith("error: step photo_check is pending")

    code, out, _ = _cli(tmp_path, "projects", "cancel", str(project_id))
    assert code == 0 and "is cancelled" in out
    code, out, _ = _cli(tmp_path, "projects", "show", str(project_id), "--json")
    assert json.loads(out)["steps"][0]["status"] == "cancelled"


def test_unknown_project_and_bad_inputs(tmp_path: Path) -> None:
    ctx = build_context(load_settings(overrides={"data_dir": str(tmp_path)}))
    embedded.prepare(ctx)
    ctx.close()
    code, _, err = _cli(tmp_path, "projects", "show", str(uuid.uuid4()))
    assert code == 5 and err.startswith("error: project")
    code, _, err = _cli(tmp_path, "projects", "show", "nope")
    assert code == 2
    code, _, err = _cli(tmp_path, "projects", "run", "photo_story", "--input", "script=Hi.")
    assert code == 2 and "--input photo=PATH" in err
    code, _, err = _cli(
        tmp_path, "projects", "run", "photo_story", "--input", "photo=missing.png", "--input", "script=x"
    )
    assert code == 2 and "no such file" in err
    code, _, err = _cli(tmp_path, "projects", "run", "nope", "--input", "photo=x")
    assert code == 5 and "unknown workflow" in err
