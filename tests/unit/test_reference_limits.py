"""The pure reference/duration/ratio rules of `domain.references`, row by row, and how `normalize` applies them."""

from __future__ import annotations

from decimal import Decimal

import pytest

from aivedio_engine.domain.references import (
    MB,
    LimitExceeded,
    ModelLimits,
    Reference,
    check_references,
    check_shape,
    default_duration,
)
from aivedio_engine.domain.requests import Catalog, InvalidRequest, ModelSpec, normalize

GEN4 = ModelLimits(1, 0, 0, 16 * MB, 0, ("16:9", "9:16", "1:1", "4:3", "3:4", "21:9"), (5, 10), (0.5, 2.0))
GEN3A = ModelLimits(2, 0, 0, 16 * MB, 0, ("16:9", "9:16"), (5, 10))
ALEPH = ModelLimits(1, 1, 1, 16 * MB, 32 * MB, durations=(5,))
VEO = ModelLimits(1, 0, 0, 8 * MB, 0, ("16:9", "9:16"), (4, 6, 8))
ANY = ModelLimits(4, 2, 0, 20 * MB, 200 * MB)


def img(n: int = 0, size: int | None = MB, w: int | None = 1280, h: int | None = 720) -> Reference:
    return Reference(f"img-{n}", False, size, w, h)


def vid(n: int = 0, size: int | None = 4 * MB) -> Reference:
    return Reference(f"vid-{n}", True, size)


# (model, limits, references, None = accepted | the exact message)
REFERENCE_CASES = [
    ("gen4_turbo", GEN4, [], None),
    ("gen4_turbo", GEN4, [img()], None),
    ("gen4_turbo", GEN4, [img(0), img(1)], "model gen4_turbo accepts at most 1 reference image (got 2)"),
    ("gen3a_turbo", GEN3A, [img(0), img(1)], None),
    ("gen3a_turbo", GEN3A, [img(0), img(1), img(2)], "model gen3a_turbo accepts at most 2 reference images (got 3)"),
    ("gen4_turbo", GEN4, [vid()], "model gen4_turbo accepts no reference video (got 1)"),
    ("gen4_aleph", ALEPH, [vid()], None),
    ("gen4_aleph", ALEPH, [vid(), img()], None),
    ("gen4_aleph", ALEPH, [img()], "model gen4_aleph needs at least 1 reference video(s) (got 0)"),
    ("gen4_aleph", ALEPH, [vid(0), vid(1)], "model gen4_aleph accepts at most 1 reference video (got 2)"),
    ("sim-v1", ANY, [img(0), img(1), img(2), img(3), vid(0), vid(1)], None),
    # sizes: at the cap is fine, one byte over is not; an unmeasured size is the vendor's to judge
    ("veo3", VEO, [img(size=8 * MB)], None),
    (
        "veo3",
        VEO,
        [img(size=8 * MB + 1)],
        "reference image img-0 is 8.0 MB (8388609 bytes); model veo3 accepts at most 8.0 MB (8388608 bytes) "
        "per reference image",
    ),
    ("veo3", VEO, [img(size=None)], None),
    (
        "gen4_aleph",
        ALEPH,
        [vid(size=33 * MB)],
        "reference video vid-0 is 33.0 MB (34603008 bytes); model gen4_aleph accepts at most 32.0 MB (33554432 bytes) "
        "per reference video",
    ),
    # the reference image's own shape (Runway: width/height within 0.5 … 2)
    ("gen4_turbo", GEN4, [img(w=1000, h=500)], None),
    (
        "gen4_turbo",
        GEN4,
        [img(w=2100, h=1000)],
        "reference image img-0 is 2100x1000 (width/height 2.10); model gen4_turbo accepts 0.5 to 2",
    ),
    ("gen4_turbo", GEN4, [img(w=None, h=None)], None),
    ("veo3", VEO, [img(w=3000, h=500)], None),  # no ratio range declared: not checked
]


@pytest.mark.parametrize(("model", "limits", "refs", "message"), REFERENCE_CASES)
def test_reference_rules(model: str, limits: ModelLimits, refs: list[Reference], message: str | None) -> None:
    if message is None:
        check_references(model, limits, refs)
        return
    with pytest.raises(LimitExceeded) as raised:
        check_references(model, limits, refs)
    assert str(raised.value) == message and raised.value.field == "asset_ids"


# (model, limits, configured max, duration, aspect, None | (field, message))
SHAPE_CASES = [
    ("veo3", VEO, 10, 4, "16:9", None),
    ("veo3", VEO, 10, 8, "9:16", None),
    ("veo3", VEO, 10, 5, "16:9", ("duration_s", "duration 5 s not allowed for veo3 (allowed: 4, 6, 8)")),
    # the configured maximum narrows the vendor's set
    ("veo3", VEO, 6, 8, "16:9", ("duration_s", "duration 8 s not allowed for veo3 (allowed: 4, 6)")),
    ("veo3", VEO, 10, 4, "1:1", ("aspect_ratio", "aspect ratio 1:1 not allowed for veo3 (allowed: 16:9, 9:16)")),
    ("gen3a_turbo", GEN3A, 10, 10, "9:16", None),
    (
        "gen3a_turbo",
        GEN3A,
        10,
        5,
        "4:3",
        ("aspect_ratio", "aspect ratio 4:3 not allowed for gen3a_turbo (allowed: 16:9, 9:16)"),
    ),
    ("gen4_turbo", GEN4, 10, 7, "21:9", ("duration_s", "duration 7 s not allowed for gen4_turbo (allowed: 5, 10)")),
    ("sim-v1", ANY, 10, 7, "21:9", None),  # no duration set: any whole second up to the maximum
]


@pytest.mark.parametrize(("model", "limits", "max_s", "duration", "aspect", "expected"), SHAPE_CASES)
def test_shape_rules(
    model: str, limits: ModelLimits, max_s: int, duration: int, aspect: str, expected: tuple[str, str] | None
) -> None:
    if expected is None:
        check_shape(model, limits, max_s, duration, aspect)
        return
    with pytest.raises(LimitExceeded) as raised:
        check_shape(model, limits, max_s, duration, aspect)
    assert (raised.value.field, str(raised.value)) == expected


@pytest.mark.parametrize(
    ("limits", "max_s", "expected"),
    [(VEO, 10, 4), (VEO, 3, 3), (GEN4, 10, 5), (ANY, 10, 5), (ANY, 2, 2), (ALEPH, 10, 5), (GEN3A, 4, 4)],
)
def test_default_duration_is_allowed_when_anything_is(limits: ModelLimits, max_s: int, expected: int) -> None:
    assert default_duration(limits, max_s) == expected


def test_describe_shows_the_limits_a_client_needs() -> None:
    assert VEO.describe(10) == {
        "max_reference_images": 1,
        "max_reference_videos": 0,
        "min_reference_videos": 0,
        "max_image_bytes": 8 * MB,
        "max_video_bytes": 0,
        "durations_s": [4, 6, 8],
        "reference_image_ratio": None,
    }
    assert ANY.describe(10)["durations_s"] is None and GEN4.describe(10)["reference_image_ratio"] == [0.5, 2.0]


def _catalog(limits: ModelLimits) -> Catalog:
    spec = ModelSpec(
        provider="runway",
        model="veo3",
        max_duration_s=10,
        resolutions=("720p",),
        price_per_second={"720p": Decimal("1")},
        default_duration_s=default_duration(limits, 10),
        limits=limits,
    )
    return Catalog(models=(spec,), default_provider="runway", default_deadline_s=3600)


def test_normalize_refuses_a_duration_or_ratio_the_model_does_not_take() -> None:
    catalog = _catalog(VEO)
    with pytest.raises(InvalidRequest) as raised:
        normalize({"prompt": "p", "model": "veo3", "duration_s": 5}, catalog)
    assert raised.value.field == "duration_s" and "duration 5 s not allowed for veo3 (allowed: 4, 6, 8)" in str(
        raised.value
    )
    with pytest.raises(InvalidRequest) as raised:
        normalize({"prompt": "p", "model": "veo3", "duration_s": 6, "aspect_ratio": "4:3"}, catalog)
    assert raised.value.field == "aspect_ratio"
    # defaults are the model's: 4 s (the allowed duration nearest 5 below it), its first ratio
    params = normalize({"prompt": "p", "model": "veo3"}, catalog)
    assert (params.duration_s, params.aspect_ratio) == (4, "16:9")
