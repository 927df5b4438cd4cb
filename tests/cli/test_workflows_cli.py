"""`aivedio workflows` and `aivedio states --machine step|project`."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from aivedio_cli.main import app

runner = CliRunner()


def test_workflows_list_and_describe() -> None:
    listed = runner.invoke(app, ["workflows", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [w["name"] for w in json.loads(listed.stdout)] == ["photo_story"]

    described = runner.invoke(app, ["workflows", "describe", "photo_story", "--format", "json"])
    assert described.exit_code == 0, described.output
    steps = {s["step"]: s for s in json.loads(described.stdout)["steps"]}
    assert steps["composition"]["project_lock"] and steps["composition"]["queue"] == "ffmpeg"
    assert steps["clip[shot]"]["generation_task"] and steps["clip[shot]"]["needs"] == ["image_qc"]
    assert steps["photo_check"]["retry_schedule_s"] == [30, 120, 300]

    mermaid = runner.invoke(app, ["workflows", "describe", "photo_story", "--format", "mermaid"])
    assert mermaid.stdout.startswith("flowchart TD") and "composition --> final_qc" in mermaid.stdout


def test_unknown_workflow_is_one_line_and_exit_5() -> None:
    result = runner.invoke(app, ["workflows", "describe", "nope"])
    assert result.exit_code == 5
    assert "unknown workflow 'nope' (known: photo_story)" in result.output


def test_states_draws_the_step_and_project_machines() -> None:
    step = runner.invoke(app, ["states", "--machine", "step", "--format", "json"])
    assert step.exit_code == 0, step.output
    edges = {(e["from"], e["event"]): e["to"] for e in json.loads(step.stdout)}
    assert edges[("running", "retry_scheduled")] == "retrying"
    assert edges[("manual_required", "approved")] == "success"
    assert len(edges) == 15
    project = runner.invoke(app, ["states", "--machine", "project", "--format", "json"])
    assert {e["to"] for e in json.loads(project.stdout)} >= {"running", "succeeded", "cancelled"}
