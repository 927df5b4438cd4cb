"""The built-in workflow definitions (`aivedio workflows list|describe`).

`photo_story` is the example that runs offline on one machine: a photo and a short script become a narrated,
subtitled video. Every step is local (ffmpeg, a TTS engine) except `clip`, which runs through the normal
generation path with the `local` provider's image-to-video, so it gets reservation, reconciliation, fetch and
settlement like any vendor call.
"""

from __future__ import annotations

from aivedio_engine.domain.project import StepDef, WorkflowDef
from aivedio_engine.domain.workflow import StepType as T

#: the project input naming the photo (a READY input-image asset), as `POST /v1/projects` and `projects run` write it
PHOTO_INPUT = "photo_asset_id"
#: the name `aivedio projects run` wrote before it used the API's: projects stored that way still run
LEGACY_PHOTO_INPUT = "photo"

PHOTO_STORY = WorkflowDef(
    name="photo_story",
    description="a photo and a short script → a narrated, subtitled MP4 (runs offline)",
    steps=(
        StepDef("photo_check", T.PHOTO_CHECK, description="ffprobe, format, size, brightness and blur checks"),
        StepDef("plan", T.PLAN, ("photo_check",), description="the script split into shots, deterministic"),
        StepDef("image", T.FINAL_IMAGE, ("plan",), per_shot=True, description="a crop / pan of the photo per shot"),
        StepDef("image_qc", T.IMAGE_QC, ("image",), per_shot=True, description="signalstats thresholds"),
        StepDef("clip", T.VIDEO_CLIP, ("image_qc",), per_shot=True, description="image-to-video, a generation task"),
        StepDef("voice", T.TTS, ("plan",), description="narration of each shot's line (TTS)"),
        StepDef("subtitles", T.SUBTITLES, ("voice",), description="SRT timed from the narration durations"),
        StepDef("music", T.BGM, ("plan",), description="background bed, ducked under the voice"),
        StepDef(
            "composition",
            T.COMPOSITION,
            ("clip", "voice", "subtitles", "music"),
            description="concat + subtitles + amix → H.264/AAC MP4",
        ),
        StepDef("final_qc", T.FINAL_QC, ("composition",), description="duration, streams, loudness (ebur128)"),
        StepDef("delivery", T.DELIVERY, ("final_qc",), description="the result asset published to the project"),
    ),
)

WORKFLOWS: dict[str, WorkflowDef] = {w.name: w for w in (PHOTO_STORY,)}


def get(name: str) -> WorkflowDef:
    try:
        return WORKFLOWS[name]
    except KeyError:
        raise KeyError(f"unknown workflow {name!r} (known: {', '.join(sorted(WORKFLOWS))})") from None


def photo_asset_id(project_input: dict[str, object]) -> object:
    return project_input.get(PHOTO_INPUT, project_input.get(LEGACY_PHOTO_INPUT))
