"""Step limits as pure decisions, and one broker route per step queue with the seed's names."""

from __future__ import annotations

import pytest

from aivedio_engine.config import ConfigError, load_settings
from aivedio_engine.domain.events import BY_ACTOR, STEP_ROUTES, EventType
from aivedio_engine.domain.step_limits import Running, StepLimits, project_cap, refusal, step_priority
from aivedio_engine.domain.workflow import Priority, QueueName, StepType

LIMITS = StepLimits(project_image_steps=2, queue_running={"real_video_clip": 1})

SEED_QUEUES = (
    "photo_check text image video voice audio ffmpeg qc cleanup notification "
    "identity_anchor face_consistency motion_portrait real_video_clip video_clip_qc lipsync"
).split()


def test_every_seed_queue_has_its_own_broker_queue_and_actor() -> None:
    assert [q.value for q in QueueName] == SEED_QUEUES
    for q in QueueName:
        route = STEP_ROUTES[q]
        assert route.queue.value == q.value and route.actor == f"run_step_{q.value}"
        assert BY_ACTOR[route.actor] is route
    assert EventType.STEP_DUE.value == "workflow.step.due"
    # the face check decides whether generation goes on; costly video and cleanup yield to the rest
    assert STEP_ROUTES[QueueName.FACE_CONSISTENCY].priority < STEP_ROUTES[QueueName.IMAGE].priority
    assert STEP_ROUTES[QueueName.IMAGE].priority < STEP_ROUTES[QueueName.REAL_VIDEO_CLIP].priority
    assert STEP_ROUTES[QueueName.REAL_VIDEO_CLIP].priority < STEP_ROUTES[QueueName.CLEANUP].priority


def test_n_image_steps_per_project() -> None:
    assert project_cap(StepType.FINAL_IMAGE, LIMITS) == project_cap(StepType.PREVIEW_IMAGE, LIMITS) == 2
    assert refusal(StepType.FINAL_IMAGE, "image", Running(same_project_scope=1), LIMITS) is None
    why = refusal(StepType.FINAL_IMAGE, "image", Running(same_project_scope=2), LIMITS)
    assert why is not None and "max 2" in why


def test_one_composition_per_project() -> None:
    assert project_cap(StepType.COMPOSITION, LIMITS) == 1
    assert refusal(StepType.COMPOSITION, "ffmpeg", Running(), LIMITS) is None
    assert refusal(StepType.COMPOSITION, "ffmpeg", Running(same_project_scope=1), LIMITS) is not None


def test_capped_queues_count_everywhere_and_other_steps_are_free() -> None:
    assert refusal(StepType.REAL_VIDEO_CLIP, "real_video_clip", Running(same_queue=0), LIMITS) is None
    why = refusal(StepType.REAL_VIDEO_CLIP, "real_video_clip", Running(same_queue=1), LIMITS)
    assert why is not None and "queue real_video_clip" in why
    assert project_cap(StepType.TTS, LIMITS) is None
    assert refusal(StepType.TTS, "voice", Running(same_project_scope=99, same_queue=99), LIMITS) is None


def test_settings_name_only_known_queues() -> None:
    settings = load_settings(overrides={"workflows": {"queue_max_running": {"lipsync": 3}}})
    assert settings.workflows.queue_max_running == {"lipsync": 3}
    with pytest.raises(ConfigError, match="workflows.*unknown queue lip_sync"):
        load_settings(overrides={"workflows": {"queue_max_running": {"lip_sync": 3}}})
    with pytest.raises(ConfigError, match="provider_steps_per_s"):
        load_settings(overrides={"workflows": {"provider_steps_per_s": {"local": 0}}})


def test_cleanup_steps_come_last_whatever_their_project() -> None:
    assert step_priority(StepType.CLEANUP, Priority.PREMIUM) == Priority.CLEANUP == 5
    assert step_priority(StepType.FINAL_IMAGE, Priority.PREMIUM) == 1
    assert step_priority(StepType.FINAL_IMAGE, Priority.FREE_PREVIEW) == 4
