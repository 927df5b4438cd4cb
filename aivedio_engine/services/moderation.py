"""The input moderation hook (issue 16 item 7): which moderator checks a generation request, and how.

`GenerationService.create` calls the moderator after the request and its references are validated and before the
reservation (comes before step 14): a REJECT is a 422 `moderation-rejected` with nothing
reserved, created or queued, so "release the whole reservation" holds trivially — there is none. A WARN
creates the task with the verdict's reasons kept beside its params (`input_review`, outside the request hash), and
the media step holds its output for a human (MANUAL_REVIEW, a review item in `aivedio review`), exactly like an
output hold.

`moderation.moderator` picks the implementation: "rules" is `domain.moderation.RuleModerator` on the configured
term lists and image rules; "package.module:factory" is any callable taking the Settings and returning an object
with `check(ModerationInput) -> ModerationResult` (a vendor's moderation API, a model of your own).
"""

from __future__ import annotations

import importlib
from typing import Protocol

from aivedio_engine.config import Settings
from aivedio_engine.domain.moderation import ImageRules, ModerationInput, ModerationResult, RuleModerator

#: the params key a WARN verdict's reasons are kept under; the media step reads it
INPUT_REVIEW = "input_review"


class InputModerator(Protocol):
    def check(self, request: ModerationInput) -> ModerationResult: ...


def build_moderator(settings: Settings) -> InputModerator:
    m = settings.moderation
    if m.moderator == "rules":
        images = ImageRules(tuple(m.image_formats), m.max_image_bytes, m.min_image_side, m.max_image_pixels)
        return RuleModerator(m.reject_terms, m.warn_terms, images)
    module_name, sep, attr = m.moderator.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"moderation.moderator must be 'rules' or 'package.module:factory', not {m.moderator!r}")
    factory = getattr(importlib.import_module(module_name), attr)
    moderator: InputModerator = factory(settings)
    return moderator
