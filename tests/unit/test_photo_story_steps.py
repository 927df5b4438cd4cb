"""Pure parts of the photo_story steps: the storyboard, the SRT timing, the per-shot crops, the ffmpeg argv and the
mapping of a failed generation task to a System B error code."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from aivedio_engine.domain.project_cost import split_script
from aivedio_engine.domain.workflow import ErrorCode, error_code_for
from aivedio_engine.media import story
from aivedio_engine.media.probe import MediaLimits
from aivedio_engine.workflows.executors import Run, Waiting, build_srt, clip, srt_time


def test_script_splits_into_sentences_latin_and_cjk() -> None:
    assert split_script("Hello there.  Good bye!\nWhy?") == ["Hello there.", "Good bye!", "Why?"]
    assert split_script("你好。再见！") == ["你好。", "再见！"]
    assert split_script("no full stop") == ["no full stop"]


def test_srt_cues_follow_the_spoken_length_within_each_shot() -> None:
    srt = build_srt(["One.", "Two three."], spoken=[0.8, 3.5], shot_s=[2.0, 2.0])
    assert "1\n00:00:00,000 --> 00:00:00,800\nOne.\n" in srt
    # spoken longer than its shot: the cue stops at the shot's end
    assert "2\n00:00:02,000 --> 00:00:04,000\nTwo three.\n" in srt
    assert srt_time(3723.5) == "01:02:03,500"


def test_each_shot_gets_a_different_16_9_window_inside_the_photo() -> None:
    crops = [story.shot_crop(800, 600, i, 3) for i in range(3)]
    assert len({(c.x, c.y) for c in crops}) == 3
    for c in crops:
        assert abs(c.w / c.h - 16 / 9) < 0.02 and c.w % 2 == 0 and c.h % 2 == 0
        assert 0 <= c.x and c.x + c.w <= 800 and 0 <= c.y and c.y + c.h <= 600


def test_compose_argv_ducks_the_music_and_keeps_subtitles_as_a_track() -> None:
    argv = story.compose_argv(["c0.mp4", "c1.mp4"], "voice.wav", "music.wav", "subs.srt", "out.mp4", 2.0)
    graph = argv[argv.index("-filter_complex") + 1]
    assert "[bed][key]sidechaincompress" in graph and "concat=n=2:v=1:a=0" in graph
    assert "subtitles=" not in graph  # soft by default: the local provider already draws the line
    assert argv[argv.index("-c:s") + 1] == "mov_text" and argv[argv.index("-c:v") + 1] == "libx264"
    assert all(a.startswith("file:") for a in argv if a.endswith((".mp4", ".wav", ".srt")))


def test_loudness_is_read_from_the_summary() -> None:
    text = (
        "[Parsed_ebur128_0] t: 1 M: -30 S: -30 I: -40.0 LUFS\n  Summary:\n\n  Integrated loudness:\n    I: -16.2 LUFS\n"
    )
    assert story.parse_loudness(text) == -16.2


def test_a_failed_provider_job_maps_to_provider_error() -> None:
    assert error_code_for("provider_failed") is ErrorCode.PROVIDER_ERROR
    assert error_code_for("connect_failed") is ErrorCode.PROVIDER_TIMEOUT
    assert error_code_for(None) is ErrorCode.UNKNOWN_ERROR


def _clip_run(provider_request_id: str | None, live: tuple[Any, str] | None, calls: list[str]) -> Run:
    plan = SimpleNamespace(output_json={"shots_detail": [{"text": "Hi.", "duration_s": 1}]})
    image = SimpleNamespace(output_json={"key": "workflows/p/image-0/shot.png"})
    step = SimpleNamespace(
        id=uuid.UUID(int=7),
        version=4,
        step_key="clip[0]",
        input_json={"shot": 0},
        provider_request_id=provider_request_id,
    )

    def generate(tenant: Any, image: Any, prompt: str, duration: int, key: str) -> tuple[uuid.UUID, str]:
        calls.append(f"generate {key} {prompt} {duration}")
        return uuid.UUID(int=9), "local"

    return Run(
        step=step,  # type: ignore[arg-type]
        project=SimpleNamespace(tenant_id=uuid.UUID(int=1)),  # type: ignore[arg-type]
        outputs={"plan": plan, "image[0]": image},  # type: ignore[dict-item]
        workdir=Path("/nonexistent"),
        store=SimpleNamespace(download_to=lambda key, path: calls.append(f"fetch {key}")),  # type: ignore[arg-type]
        limits=MediaLimits(),
        generate=generate,
        publish=lambda tenant, result: uuid.UUID(int=0),
        photo_key=lambda: "photo",
        note_key=lambda key: calls.append(f"note {key}"),
        find_live=lambda tenant, key: calls.append(f"find {key}") or live,  # type: ignore[func-returns-value]
    )


def test_clip_writes_its_key_down_before_creating_the_generation() -> None:
    calls: list[str] = []
    outcome = clip(_clip_run(None, None, calls))
    key = f"wf:{uuid.UUID(int=7)}:v4"
    assert calls == [f"note {key}", "fetch workflows/p/image-0/shot.png", f"generate {key} Hi. 1"]
    assert outcome == Waiting(uuid.UUID(int=9), "local")


def test_clip_adopts_the_live_generation_of_a_try_that_died_before_recording_it() -> None:
    calls: list[str] = []
    outcome = clip(_clip_run("wf:old", (uuid.UUID(int=5), "local"), calls))
    assert calls == ["find wf:old"]  # nothing created: one clip never costs two generations
    assert outcome == Waiting(uuid.UUID(int=5), "local")
    calls.clear()
    clip(_clip_run("wf:old", None, calls))  # the old one failed: a new try, a new key
    assert calls[0] == "find wf:old" and calls[1].startswith("note wf:") and calls[-1].startswith("generate")
