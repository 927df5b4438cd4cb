"""Input moderation rules: the built-in, local moderator. Pure: no I/O.

A request's prompt and its reference images are checked after validation and before any credit is reserved, so
a refusal leaves nothing to release. The verdict is the worst of the rules that fired: a reject term or an
unacceptable image refuses the request; a warn term lets it through with its output held for a human.

Terms match whole words in any case ("gore" matches "Gore," but not "gorey" or "category"), so a short term does
not refuse every prompt that happens to contain its letters. Image rules look only at what upload validation
measured: a fact it did not record (an older asset) is not held against the request.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from aivedio_engine.domain.status import ModerationVerdict


@dataclass(frozen=True, slots=True)
class ReferenceFacts:
    """What upload validation recorded about one reference (None: not measured)."""

    asset_id: str
    is_video: bool
    mime: str | None
    size_bytes: int | None
    width: int | None
    height: int | None


@dataclass(frozen=True, slots=True)
class ModerationInput:
    prompt: str
    references: tuple[ReferenceFacts, ...] = ()


@dataclass(frozen=True, slots=True)
class ModerationResult:
    verdict: ModerationVerdict
    #: why, one short phrase per rule that fired (never the whole prompt)
    reasons: tuple[str, ...] = ()

    @property
    def summary(self) -> str:
        return "; ".join(self.reasons)


ALLOW = ModerationResult(ModerationVerdict.ALLOW)


@dataclass(frozen=True, slots=True)
class ImageRules:
    formats: tuple[str, ...]
    max_bytes: int
    min_side: int
    max_pixels: int


class RuleModerator:
    """Term lists for the prompt, format and size rules for reference images."""

    def __init__(self, reject_terms: Sequence[str], warn_terms: Sequence[str], images: ImageRules) -> None:
        self._reject = _pattern(reject_terms)
        self._warn = _pattern(warn_terms)
        self._images = images

    def check(self, request: ModerationInput) -> ModerationResult:
        rejected: list[str] = []
        warned: list[str] = []
        if self._reject is not None:
            rejected += [f"prompt contains the refused term {t!r}" for t in _hits(self._reject, request.prompt)]
        for ref in request.references:
            if not ref.is_video:
                rejected += self._image_faults(ref)
        if rejected:
            return ModerationResult(ModerationVerdict.REJECT, tuple(rejected))
        if self._warn is not None:
            warned += [f"prompt contains the review term {t!r}" for t in _hits(self._warn, request.prompt)]
        return ModerationResult(ModerationVerdict.WARN, tuple(warned)) if warned else ALLOW

    def _image_faults(self, ref: ReferenceFacts) -> list[str]:
        rules, faults = self._images, []
        name = f"reference {ref.asset_id}"
        if ref.mime is not None and ref.mime not in rules.formats:
            faults.append(f"{name} is {ref.mime}, not one of {', '.join(rules.formats)}")
        if ref.size_bytes is not None and ref.size_bytes > rules.max_bytes:
            faults.append(f"{name} is {ref.size_bytes} bytes, more than {rules.max_bytes}")
        if ref.width is not None and ref.height is not None:
            if min(ref.width, ref.height) < rules.min_side:
                faults.append(f"{name} is {ref.width}x{ref.height}, a side below {rules.min_side} px")
            if ref.width * ref.height > rules.max_pixels:
                faults.append(f"{name} is {ref.width}x{ref.height}, more than {rules.max_pixels} pixels")
        return faults


def _pattern(terms: Sequence[str]) -> re.Pattern[str] | None:
    cleaned = sorted({t.strip().casefold() for t in terms if t.strip()}, key=len, reverse=True)
    if not cleaned:
        return None
    # \b only where the term itself starts/ends with a word character, so a term like "18+" still matches
    alternatives = [
        (r"\b" if t[0].isalnum() else "") + re.escape(t) + (r"\b" if t[-1].isalnum() else "") for t in cleaned
    ]
    return re.compile("|".join(alternatives))


def _hits(pattern: re.Pattern[str], prompt: str) -> list[str]:
    return list(dict.fromkeys(m.group(0) for m in pattern.finditer(prompt.casefold())))
