"""The in-process auth cache: a verified key costs no database round trip for `api.auth_cache_ttl_s`, a key
revoked by this process is refused at once, and one revoked elsewhere is refused within the TTL (≤ 5 s)."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from aivedio_engine.services.tenants import TenantService
from tests.support.app import FakeClock, make_context, tenant_with_key


def _statements(engine: sa.Engine) -> list[str]:
    seen: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    return seen


def test_a_key_revoked_by_another_process_is_refused_within_the_ttl(tmp_path: Path) -> None:
    clock = FakeClock()
    ctx = make_context(tmp_path / "data", clock=clock)
    who = tenant_with_key(ctx, "alice")
    api_a = TenantService(ctx.engine, clock, ctx.settings)  # one API process
    api_b = TenantService(ctx.engine, clock, ctx.settings)  # another one, where the key gets revoked
    seen = _statements(ctx.engine)
    principal = api_a.authenticate(who.key)
    assert principal is not None and principal.tenant_id == who.tenant_id
    reads = len(seen)
    assert api_a.authenticate(who.key) == principal and len(seen) == reads  # cached: no statement

    api_b.revoke_key(principal.key_id)
    assert api_b.authenticate(who.key) is None  # the revoking process refuses at once
    clock.advance(4.9)
    assert api_a.authenticate(who.key) == principal  # within the TTL the other process still trusts it
    clock.advance(0.2)
    assert api_a.authenticate(who.key) is None  # 5.1 s after it was verified: refused everywhere
    assert ctx.settings.api.auth_cache_ttl_s == 5
    ctx.close()


def test_an_unknown_key_is_never_cached(tmp_path: Path) -> None:
    clock = FakeClock()
    ctx = make_context(tmp_path / "data", clock=clock)
    who = tenant_with_key(ctx, "bob")
    api = TenantService(ctx.engine, clock, ctx.settings)
    assert api.authenticate(who.key + "x") is None
    _, fresh = ctx.tenants.create_key(who.tenant_id)
    assert api.authenticate(fresh) is not None  # a key made a moment ago works at once
    ctx.close()
