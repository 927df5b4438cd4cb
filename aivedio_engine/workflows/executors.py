"""Step executors of the `photo_story` workflow: one small function per step type.

`execute(run)` gets the step, the project's input and the outputs of the steps that succeeded before it, does its
work in a private directory, stores files in the object store (`workflows/{project}/{step}/…`) and returns what
the step produced. It never moves a state: the runner reports the outcome to the WorkflowService. A failure is a
`StepFailed` carrying the seed's error code, so the service can apply its retry rules.

The clip step is the exception to "returns an output": it starts a generation task through the normal generation
path (reservation, SUBMIT_UNKNOWN reconciliation, fetch, settlement) and returns `Waiting`; the runner finishes it
when that task reaches a terminal status.
"""

from __future__ import annotations

import re
import uuid
import wave
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aivedio_engine.domain.project_cost import MAX_SHOTS, storyboard
from aivedio_engine.domain.workflow import ErrorCode, StepType
from aivedio_engine.media import story
from aivedio_engine.media.derive import MediaError, MediaInterrupted
from aivedio_engine.media.probe import MediaLimits, ProbeError, ProbeInterrupted, ProbeUnavailable, probe_file
from aivedio_engine.services.workflows import Project, Step
from aivedio_engine.storage.base import ObjectStore, iter_file

#: photo sanity thresholds (signalstats on 8-bit luma, blurdetect's score: higher is blurrier)
MIN_PHOTO_SIDE = 160
MIN_YAVG, MAX_YAVG = 25.0, 235.0
MIN_CONTRAST = 24.0
MAX_BLUR = 20.0
#: image QC of each shot (a crop of a photo that passed the check can still be a flat corner of it)
MIN_SHOT_CONTRAST = 16.0
#: final QC: integrated loudness window (EBU R128 programme at -16 LUFS, with room for short clips)
LOUDNESS_RANGE = (-24.0, -10.0)
DURATION_TOLERANCE_S = 0.25
MAX_FILE_BYTES = 512 * 1024 * 1024


class StepFailed(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Done:
    output: dict[str, Any]
    asset_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class Waiting:
    """The step waits on this generation task."""

    generation_task_id: uuid.UUID
    provider: str | None


@dataclass(frozen=True, slots=True)
class Result:
    """What the delivery step hands to the service to make the project's result asset."""

    key: str
    size_bytes: int
    sha256: str | None
    duration_ms: int | None
    width: int | None
    height: int | None


@dataclass
class Run:
    step: Step
    project: Project
    #: succeeded steps of the project, by step key
    outputs: dict[str, Step]
    workdir: Path
    store: ObjectStore
    limits: MediaLimits
    #: start a generation: (tenant, image file, prompt, duration_s, idempotency key) → (task id, provider)
    generate: Callable[[uuid.UUID, Path, str, int, str], tuple[uuid.UUID, str | None]]
    #: record the delivered video as an asset → its id
    publish: Callable[[uuid.UUID, Result], uuid.UUID]
    #: the stored key of the project's photo (an input asset) → raises StepFailed(INPUT_INVALID) when unusable
    photo_key: Callable[[], str]
    #: record the generation idempotency key of this try on the step, before the task is created
    note_key: Callable[[str], None]
    #: (tenant, idempotency key) → (task id, provider) of a generation that is still running or succeeded
    find_live: Callable[[uuid.UUID, str], tuple[uuid.UUID, str | None] | None]
    ffmpeg: str = "ffmpeg"

    # --- files ---------------------------------------------------------------------------------------------

    def key(self, name: str) -> str:
        step = re.sub(r"[^A-Za-z0-9_-]", "-", self.step.step_key).strip("-")
        return f"workflows/{self.project.id}/{step}/{name}"

    def save(self, name: str, content_type: str) -> str:
        key = self.key(name)
        try:
            with open(self.workdir / name, "rb") as f:
                self.store.put_stream(key, iter_file(f), content_type, MAX_FILE_BYTES)
        except Exception as exc:
            raise StepFailed(ErrorCode.STORAGE_FAILED, f"cannot store {name}: {exc}") from exc
        return key

    def fetch(self, key: str, name: str) -> str:
        try:
            self.store.download_to(key, self.workdir / name)
        except Exception as exc:
            raise StepFailed(ErrorCode.STORAGE_FAILED, f"cannot read {key}: {exc}") from exc
        return name

    def output(self, step_key: str) -> dict[str, Any]:
        s = self.outputs.get(step_key)
        if s is None or s.output_json is None:
            raise StepFailed(ErrorCode.INPUT_INVALID, f"{self.step.step_key} needs the output of {step_key}")
        return s.output_json

    @property
    def shot(self) -> int:
        shot = self.step.input_json.get("shot")
        if not isinstance(shot, int):
            raise StepFailed(ErrorCode.INPUT_INVALID, f"{self.step.step_key} is not a per-shot step")
        return shot

    def plan(self) -> list[dict[str, Any]]:
        shots = self.output("plan").get("shots_detail")
        if not isinstance(shots, list) or not shots:
            raise StepFailed(ErrorCode.INPUT_INVALID, "the plan has no shots")
        return shots

    def media(self, argv: list[str], code: ErrorCode = ErrorCode.FFMPEG_FAILED) -> str:
        try:
            return story.run_capture(argv, self.workdir, self.limits)
        except MediaInterrupted:
            raise  # stopped, not failed: the runner puts the step back without using a retry
        except MediaError as exc:
            raise StepFailed(code, exc.message) from exc


# --- steps ---------------------------------------------------------------------------------------------------


def photo_check(run: Run) -> Done:
    """ffprobe (a real PNG/JPEG/WebP image of a sane size), then brightness, contrast and sharpness."""
    name = run.fetch(run.photo_key(), "photo")
    try:
        probed = probe_file(run.workdir / name, "image", run.limits)
    except ProbeInterrupted as exc:
        raise MediaInterrupted(str(exc)) from exc
    except ProbeUnavailable as exc:
        raise StepFailed(ErrorCode.FFMPEG_FAILED, str(exc)) from exc
    except ProbeError as exc:
        raise StepFailed(ErrorCode.PHOTO_QUALITY_FAIL, f"not a usable image: {exc}") from exc
    v = probed.video
    if v is None or not v.width or not v.height:
        raise StepFailed(ErrorCode.PHOTO_QUALITY_FAIL, "the photo has no picture")
    if min(v.width, v.height) < MIN_PHOTO_SIDE:
        raise StepFailed(ErrorCode.PHOTO_QUALITY_FAIL, f"{v.width}x{v.height} is too small (min {MIN_PHOTO_SIDE} px)")
    run.media(story.stats_argv(name, "stats.txt", run.ffmpeg))
    stats = _stats(run, "stats.txt")
    problems = []
    if not MIN_YAVG <= stats.yavg <= MAX_YAVG:
        problems.append(f"brightness {stats.yavg:.0f} outside {MIN_YAVG:.0f}–{MAX_YAVG:.0f}")
    if stats.ymax - stats.ymin < MIN_CONTRAST:
        problems.append(f"contrast {stats.ymax - stats.ymin:.0f} below {MIN_CONTRAST:.0f}")
    if stats.blur is None or stats.blur > MAX_BLUR:
        problems.append("too blurry" if stats.blur is not None else "no edges at all (blank or very blurry)")
    if problems:
        raise StepFailed(ErrorCode.PHOTO_QUALITY_FAIL, "; ".join(problems))
    return Done(
        {
            "width": v.width,
            "height": v.height,
            "format": probed.format_name,
            "brightness": stats.yavg,
            "contrast": stats.ymax - stats.ymin,
            "blur": stats.blur,
        }
    )


def _stats(run: Run, name: str) -> story.ImageStats:
    try:
        return story.parse_stats((run.workdir / name).read_text())
    except (OSError, MediaError) as exc:
        raise StepFailed(ErrorCode.FFMPEG_FAILED, f"no image statistics: {exc}") from exc


def plan(run: Run) -> Done:
    """Deterministic storyboard: one shot per sentence, its length from its words (whole seconds, ≥ 1)."""
    script = run.project.input.get("script")
    if not isinstance(script, str) or not script.strip():
        raise StepFailed(ErrorCode.INPUT_INVALID, "the script is empty")
    # `storyboard` is also what the project's cost estimate is made from (domain/project_cost.py)
    board = storyboard(script)
    if len(board) > MAX_SHOTS:
        raise StepFailed(ErrorCode.PLAN_LIMIT_CONFLICT, f"{len(board)} sentences: at most {MAX_SHOTS} shots")
    check = run.output("photo_check")
    shots = []
    for i, shot in enumerate(board):
        crop = story.shot_crop(int(check["width"]), int(check["height"]), i, len(board))
        shots.append(
            {"index": i, "text": shot.text, "duration_s": shot.duration_s, "crop": [crop.x, crop.y, crop.w, crop.h]}
        )
    return Done({"shots": len(shots), "shots_detail": shots, "duration_s": sum(s["duration_s"] for s in shots)})


def image(run: Run) -> Done:
    """The shot's crop of the photo at the frame size."""
    shot = run.plan()[run.shot]
    run.fetch(run.photo_key(), "photo")
    x, y, w, h = shot["crop"]
    run.media(story.crop_argv("photo", "shot.png", story.Crop(x, y, w, h), run.ffmpeg))
    return Done({"key": run.save("shot.png", "image/png"), "crop": shot["crop"]})


def image_qc(run: Run) -> Done:
    """signalstats thresholds on the shot image: exposure and contrast."""
    key = run.output(f"image[{run.shot}]")["key"]
    run.fetch(key, "shot.png")
    run.media(story.stats_argv("shot.png", "stats.txt", run.ffmpeg))
    stats = _stats(run, "stats.txt")
    contrast = stats.ymax - stats.ymin
    if not MIN_YAVG <= stats.yavg <= MAX_YAVG or contrast < MIN_SHOT_CONTRAST:
        raise StepFailed(
            ErrorCode.PHOTO_QUALITY_FAIL, f"shot {run.shot}: brightness {stats.yavg:.0f}, contrast {contrast:.0f}"
        )
    return Done({"brightness": stats.yavg, "contrast": contrast, "passed": True})


def clip(run: Run) -> Waiting:
    """Image-to-video through the generation engine; one task per try of this step (the key says which)."""
    shot = run.plan()[run.shot]
    # a previous try that died before recording its task: adopt that task if it still runs or succeeded, so one
    # clip never costs two generations
    previous = run.step.provider_request_id
    if previous is not None and (live := run.find_live(run.project.tenant_id, previous)) is not None:
        return Waiting(*live)
    # one key per claim of the step (its version moves on every claim, also after a manual retry that resets
    # retry_count), written down before the task is created
    key = f"wf:{run.step.id}:v{run.step.version}"
    run.note_key(key)
    run.fetch(run.output(f"image[{run.shot}]")["key"], "shot.png")
    task_id, provider = run.generate(
        run.project.tenant_id, run.workdir / "shot.png", shot["text"], int(shot["duration_s"]), key
    )
    return Waiting(task_id, provider)


def voice(run: Run) -> Done:
    """Narration: each shot's line spoken (ffmpeg's flite, else espeak-ng), padded or cut to its shot."""
    shots = run.plan()
    speech = []
    for i, shot in enumerate(shots):
        (run.workdir / f"line{i}.txt").write_text(shot["text"], encoding="utf-8")
        if story.has_flite(run.ffmpeg):
            run.media(story.flite_argv(f"line{i}.txt", f"speech{i}.wav", run.ffmpeg))
        elif (espeak := story.espeak_bin()) is not None:
            run.media(story.espeak_argv(espeak, f"line{i}.txt", f"speech{i}.wav"))
        else:
            raise StepFailed(ErrorCode.FFMPEG_FAILED, "no TTS engine: ffmpeg lacks flite and espeak-ng is missing")
        speech.append(f"speech{i}.wav")
    spoken = [_wav_seconds(run.workdir / name) for name in speech]
    durations = [float(s["duration_s"]) for s in shots]
    run.media(story.narration_argv(speech, durations, "voice.wav", run.ffmpeg))
    return Done(
        {
            "key": run.save("voice.wav", "audio/wav"),
            "spoken_s": [round(s, 3) for s in spoken],
            "shot_s": durations,
            "engine": "flite" if story.has_flite(run.ffmpeg) else "espeak-ng",
        }
    )


def _wav_seconds(path: Path) -> float:
    try:
        with wave.open(str(path)) as w:
            return w.getnframes() / float(w.getframerate())
    except (OSError, wave.Error, EOFError) as exc:
        raise StepFailed(ErrorCode.FFMPEG_FAILED, f"unreadable speech: {exc}") from exc


def srt_time(seconds: float) -> str:
    ms = int(round(seconds * 1000))
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d},{ms % 1000:03d}"


def build_srt(texts: list[str], spoken: list[float], shot_s: list[float]) -> str:
    """One cue per shot, from its start for as long as its line is spoken (at least half a second, never past
    the shot)."""
    cues, start = [], 0.0
    for i, (text, said, length) in enumerate(zip(texts, spoken, shot_s, strict=True)):
        end = start + min(length, max(0.5, said))
        cues.append(f"{i + 1}\n{srt_time(start)} --> {srt_time(end)}\n{text}\n")
        start += length
    return "\n".join(cues) + "\n"


def subtitles(run: Run) -> Done:
    v = run.output("voice")
    texts = [s["text"] for s in run.plan()]
    (run.workdir / "subs.srt").write_text(build_srt(texts, v["spoken_s"], v["shot_s"]), encoding="utf-8")
    return Done({"key": run.save("subs.srt", "application/x-subrip"), "cues": len(texts)})


def music(run: Run) -> Done:
    total = float(run.output("plan")["duration_s"])
    seed = int(run.project.input_hash[:8], 16)
    run.media(story.music_argv(total, seed, "music.wav", run.ffmpeg))
    return Done({"key": run.save("music.wav", "audio/wav"), "duration_s": total})


def composition(run: Run) -> Done:
    shots = run.plan()
    clips = [run.fetch(run.output(f"clip[{i}]")["key"], f"clip{i}.mp4") for i in range(len(shots))]
    voice_name = run.fetch(run.output("voice")["key"], "voice.wav")
    music_name = run.fetch(run.output("music")["key"], "music.wav")
    srt = run.fetch(run.output("subtitles")["key"], "subs.srt")
    total = float(sum(s["duration_s"] for s in shots))
    run.media(story.compose_argv(clips, voice_name, music_name, srt, "story.mp4", total, ffmpeg_bin=run.ffmpeg))
    return Done({"key": run.save("story.mp4", "video/mp4"), "duration_s": total})


def final_qc(run: Run) -> Done:
    """The delivered file as a viewer gets it: H.264 + AAC (+ the subtitle track), the planned length, and a
    loudness a person can listen to (ebur128's integrated loudness in `LOUDNESS_RANGE`)."""
    comp = run.output("composition")
    run.fetch(comp["key"], "story.mp4")
    try:
        doc = story.probe_streams("story.mp4", run.workdir, run.limits)
    except MediaInterrupted:
        raise
    except MediaError as exc:
        raise StepFailed(ErrorCode.FFMPEG_FAILED, f"the composed video does not probe: {exc.message}") from exc
    streams = [s for s in doc.get("streams", []) if isinstance(s, dict)]
    codecs = {str(s.get("codec_type")): str(s.get("codec_name")) for s in streams}
    video = next((s for s in streams if s.get("codec_type") == "video"), {})
    try:
        duration = float(doc.get("format", {}).get("duration"))
    except (TypeError, ValueError):
        duration = float("nan")
    problems = []
    if codecs.get("video") != "h264" or codecs.get("audio") != "aac":
        problems.append(f"streams {codecs}")
    expected = float(comp["duration_s"])
    if not abs(duration - expected) <= DURATION_TOLERANCE_S:
        problems.append(f"duration {duration} s, expected {expected} s")
    summary = run.media(story.loudness_argv("story.mp4", run.ffmpeg))
    try:
        lufs = story.parse_loudness(summary)
    except MediaError as exc:
        raise StepFailed(ErrorCode.FFMPEG_FAILED, exc.message) from exc
    if not LOUDNESS_RANGE[0] <= lufs <= LOUDNESS_RANGE[1]:
        problems.append(f"loudness {lufs} LUFS outside {LOUDNESS_RANGE}")
    if problems:
        raise StepFailed(ErrorCode.FFMPEG_FAILED, "final QC: " + "; ".join(problems))
    return Done(
        {
            "duration_s": duration,
            "streams": codecs,
            "subtitles": codecs.get("subtitle"),
            "loudness_lufs": lufs,
            "width": video.get("width"),
            "height": video.get("height"),
            "passed": True,
        }
    )


def delivery(run: Run) -> Done:
    comp, qc = run.output("composition"), run.output("final_qc")
    head = run.store.head(comp["key"])
    if head is None:
        raise StepFailed(ErrorCode.STORAGE_FAILED, "the composed video is gone from the store")
    duration = qc.get("duration_s")
    asset_id = run.publish(
        run.project.tenant_id,
        Result(
            comp["key"],
            head.size,
            head.sha256,
            int(duration * 1000) if isinstance(duration, (int, float)) else None,
            qc.get("width"),
            qc.get("height"),
        ),
    )
    return Done({"asset_id": str(asset_id), "key": comp["key"]}, asset_id=asset_id)


EXECUTORS: dict[StepType, Callable[[Run], Done | Waiting]] = {
    StepType.PHOTO_CHECK: photo_check,
    StepType.PLAN: plan,
    StepType.FINAL_IMAGE: image,
    StepType.IMAGE_QC: image_qc,
    StepType.VIDEO_CLIP: clip,
    StepType.TTS: voice,
    StepType.SUBTITLES: subtitles,
    StepType.BGM: music,
    StepType.COMPOSITION: composition,
    StepType.FINAL_QC: final_qc,
    StepType.DELIVERY: delivery,
}
