"""Admission limits while a dependency is degraded: the same limits, scaled down.

"Conservative" means every scope keeps `fraction` of its limit, rounded down but never below one slot, so a
degraded scheduler (counting from PostgreSQL, or leaving bandwidth to outputs about to expire) still moves
work, only less of it at a time. A fraction of 1 returns the limits unchanged.
"""

from __future__ import annotations

import math
from dataclasses import replace

from aivedio_engine.domain.admission import Limits


def scale(limit: int, fraction: float) -> int:
    """`fraction` of one limit, at least 1 (0 stays 0: a provider without slots stays closed)."""
    if limit <= 0 or fraction >= 1:
        return limit
    return max(1, math.floor(limit * fraction))


def scaled(limits: Limits, fraction: float) -> Limits:
    if fraction >= 1:
        return limits
    return replace(
        limits,
        platform=scale(limits.platform, fraction),
        tenant_default=scale(limits.tenant_default, fraction),
        tenants={k: scale(v, fraction) for k, v in limits.tenants.items()},
        providers={k: scale(v, fraction) for k, v in limits.providers.items()},
        models={k: scale(v, fraction) for k, v in limits.models.items()},
    )
