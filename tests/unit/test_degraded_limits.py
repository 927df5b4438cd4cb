"""domain/degraded.py: the conservative limits a degraded scheduler admits under."""

from __future__ import annotations

from aivedio_engine.domain.admission import Limits
from aivedio_engine.domain.degraded import scale, scaled


def test_scale_keeps_one_slot_and_a_closed_provider_closed() -> None:
    assert [scale(n, 0.5) for n in (0, 1, 2, 3, 64)] == [0, 1, 1, 1, 32]
    assert scale(7, 1.0) == 7


def test_scaled_applies_to_every_level() -> None:
    limits = Limits(platform=10, tenant_default=4, tenants={"t": 6}, providers={"p": 8, "off": 0}, models={"p/m": 2})
    got = scaled(limits, 0.5)
    assert (got.platform, got.tenant_default, dict(got.tenants)) == (5, 2, {"t": 3})
    assert dict(got.providers) == {"p": 4, "off": 0} and dict(got.models) == {"p/m": 1}
    assert scaled(limits, 1.0) is limits
