"""Tenants and their API keys. Keys are shown once; only their SHA-256 is stored."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import secrets
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from aivedio_engine.clock import Clock, new_id
from aivedio_engine.config import Settings
from aivedio_engine.db import api_keys, ledger
from aivedio_engine.db import tenants as tenant_repo
from aivedio_engine.db.handles import Engine
from aivedio_engine.db.session import read_conn, write_tx
from aivedio_engine.db.tenants import TenantLimits
from aivedio_engine.domain.admission import PriorityTier
from aivedio_engine.domain.status import LedgerEntryType, TenantStatus
from aivedio_engine.services.errors import Conflict, InvalidInput, NotFound
from aivedio_engine.services.operations import Operation, record

KEY_PREFIX = "avk_"


@dataclass(frozen=True, slots=True)
class TenantView:
    id: uuid.UUID
    name: str
    status: str
    credit_balance: Decimal
    active_keys: int
    #: the tenant's own limits (None fields: the config's default); None for a tenant not yet written
    limits: TenantLimits | None = None


@dataclass(frozen=True, slots=True)
class EffectiveLimits:
    """What applies to a tenant: its own value where it has one, else the config's default."""

    rate_limit_per_s: float
    rate_limit_burst: int
    max_concurrency: int
    priority_tier: int
    max_upload_bytes: int
    #: days; 0 keeps the data forever
    retention_outputs_days: int = 0
    retention_inputs_days: int = 0
    retention_prompts_days: int = 0


@dataclass(frozen=True, slots=True)
class LimitsUpdate:
    tenant_id: uuid.UUID
    before: TenantLimits
    #: the limits now, or for a dry run, what they would be
    after: TenantLimits
    changed: bool


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: every query made on its behalf is scoped by `tenant_id`."""

    tenant_id: uuid.UUID
    key_id: uuid.UUID


def _check_limits(changes: Mapping[str, float | int | None]) -> dict[str, float | int | None]:
    if not changes:
        raise InvalidInput("nothing to change: give at least one limit")
    clean: dict[str, float | int | None] = {}
    for name, value in changes.items():
        if name not in tenant_repo.LIMIT_COLUMNS:
            raise InvalidInput(f"not a tenant limit: {name}", field=name)
        if name == "priority_tier":
            tiers = {t.value for t in PriorityTier}
            if value is None or isinstance(value, float) or int(value) not in tiers:
                names = ", ".join(f"{t.value} {t.name.lower()}" for t in PriorityTier)
                raise InvalidInput(f"tier must be one of {names} (1 is served first)", field=name)
            clean[name] = int(value)
        elif value is None:
            clean[name] = None
        elif name == "rate_limit_per_s":
            if not math.isfinite(value) or value <= 0:
                raise InvalidInput("rate limit must be a number > 0 (requests per second)", field=name)
            clean[name] = float(value)
        else:
            if isinstance(value, float) and not value.is_integer() or value < 1 or value > 2**62:
                raise InvalidInput(f"{name.replace('_', ' ')} must be a whole number >= 1", field=name)
            clean[name] = int(value)
    return clean


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class _AuthCache:
    """Live keys seen recently, per process. A revoked key or a suspended tenant is refused by every process
    within `ttl_s`, and by this one at once; unknown keys are never cached, so a new key works immediately.
    Without it every request paid a connection checkout ending in ROLLBACK, which also throws away psycopg's
    prepared statements."""

    MAX_ENTRIES = 10_000

    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._entries: dict[bytes, tuple[Principal, float]] = {}
        self._lock = threading.Lock()

    def get(self, digest: bytes, now: float) -> Principal | None:
        hit = self._entries.get(digest)
        if hit is None or hit[1] <= now:
            return None
        return hit[0]

    def put(self, digest: bytes, principal: Principal, now: float) -> None:
        if self._ttl_s <= 0:
            return
        with self._lock:
            if len(self._entries) >= self.MAX_ENTRIES:
                self._entries.clear()
            self._entries[digest] = (principal, now + self._ttl_s)

    def forget(self, key_id: uuid.UUID | None = None, tenant_id: uuid.UUID | None = None) -> None:
        with self._lock:
            for digest, (p, _) in list(self._entries.items()):
                if p.key_id == key_id or p.tenant_id == tenant_id:
                    del self._entries[digest]


class TenantService:
    def __init__(self, engine: Engine, clock: Clock, settings: Settings) -> None:
        self._engine = engine
        self._clock = clock
        self._settings = settings
        self._auth = _AuthCache(settings.api.auth_cache_ttl_s)

    def create(
        self,
        name: str,
        credits: Decimal | None = None,
        max_concurrency: int | None = None,
        op: Operation | None = None,
        max_upload_bytes: int | None = None,
    ) -> TenantView:
        name = name.strip()
        if not name or len(name) > 128:
            raise InvalidInput("tenant name must be 1-128 characters")
        if max_upload_bytes is not None and max_upload_bytes <= 0:
            raise InvalidInput("max_upload_bytes must be > 0", field="max_upload_bytes")
        amount = self._settings.limits.tenant_default_credits if credits is None else credits
        if amount < 0:
            raise InvalidInput("credits must be >= 0")
        now = self._clock.now()
        tenant_id = new_id()
        with write_tx(self._engine) as conn:
            if tenant_repo.name_taken(conn, name):
                raise Conflict(f"a tenant named {name!r} already exists")
            if op is not None and op.dry_run:
                record(conn, op, affected_ids=[], outcome="would_create", now=now)
                return TenantView(tenant_id, name, TenantStatus.ACTIVE.value, amount, 0)
            tenant_repo.insert(
                conn,
                tenant_id,
                name,
                TenantStatus.ACTIVE.value,
                now,
                max_concurrency=max_concurrency,
                max_upload_bytes=max_upload_bytes,
            )
            if amount:
                ledger.post(
                    conn,
                    tenant_id=tenant_id,
                    entry_type=LedgerEntryType.ADJUSTMENT,
                    amount=amount,
                    business_key=f"adjustment:tenant:{tenant_id}:initial",
                    now=now,
                    created_by=op.actor if op else "cli",
                    reason="initial credits",
                )
            if op is not None:
                record(conn, op, affected_ids=[tenant_id], outcome="created", now=now)
        return TenantView(tenant_id, name, TenantStatus.ACTIVE.value, amount, 0)

    def list(self) -> list[TenantView]:
        with self._engine.connect() as conn:
            rows = tenant_repo.summaries(conn)
        return [TenantView(r.id, r.name, r.status, r.credit_balance, r.active_keys, r.limits) for r in rows]

    def limits(self, tenant_id: uuid.UUID) -> TenantLimits:
        with read_conn(self._engine) as conn:
            found = tenant_repo.limits(conn, tenant_id)
        if found is None:
            raise NotFound(f"tenant {tenant_id} not found")
        return found

    def effective(self, own: TenantLimits) -> EffectiveLimits:
        api = self._settings.api
        limits = self._settings.limits
        return EffectiveLimits(
            rate_limit_per_s=own.rate_limit_per_s or api.tenant_rate_limit_per_s,
            rate_limit_burst=own.rate_limit_burst or api.tenant_rate_burst,
            max_concurrency=own.max_concurrency or limits.tenant_default_max_concurrency,
            priority_tier=own.priority_tier,
            max_upload_bytes=own.max_upload_bytes or api.max_upload_bytes,
            retention_outputs_days=own.retention_outputs_days or self._settings.retention.outputs_days,
            retention_inputs_days=own.retention_inputs_days or self._settings.retention.inputs_days,
            retention_prompts_days=own.retention_prompts_days or self._settings.retention.prompts_days,
        )

    def update_limits(
        self, tenant_id: uuid.UUID, changes: Mapping[str, float | int | None], op: Operation
    ) -> LimitsUpdate:
        """Set (or, with None, clear back to the config default) some of a tenant's limits. Audited with the
        values before and after. API processes apply a new rate within `api.auth_cache_ttl_s`; the dispatcher
        reads concurrency and tier on its next round."""
        op.require_reason()
        clean = _check_limits(changes)
        now = self._clock.now()
        with write_tx(self._engine) as conn:
            before = tenant_repo.limits(conn, tenant_id, lock=True)
            if before is None:
                raise NotFound(f"tenant {tenant_id} not found")
            after = dataclasses.replace(before, **clean)  # type: ignore[arg-type]  # checked by _check_limits
            changed = after != before
            audited = dataclasses.replace(
                op,
                args={
                    **op.args,
                    "before": {k: getattr(before, k) for k in clean},
                    "after": {k: getattr(after, k) for k in clean},
                },
            )
            if changed and not op.dry_run:
                tenant_repo.set_limits(conn, tenant_id, clean, now)
            outcome = ("would_update" if op.dry_run else "updated") if changed else "unchanged"
            record(conn, audited, affected_ids=[tenant_id], outcome=outcome, now=now)
        return LimitsUpdate(tenant_id, before, after, changed)  # a dry run: what it would be

    def create_key(
        self, tenant_id: uuid.UUID, name: str | None = None, op: Operation | None = None
    ) -> tuple[uuid.UUID, str]:
        """Returns (key id, the key itself). The key is not stored and cannot be shown again."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        key_id = new_id()
        with write_tx(self._engine) as conn:
            if not tenant_repo.exists(conn, tenant_id):
                raise NotFound(f"tenant {tenant_id} not found")
            if op is not None and op.dry_run:
                record(conn, op, affected_ids=[tenant_id], outcome="would_create", now=self._clock.now())
                return key_id, ""
            api_keys.insert(conn, key_id, tenant_id, hash_key(key), key[:12], name, self._clock.now())
            if op is not None:  # the key itself is never recorded, only its id
                record(conn, op, affected_ids=[tenant_id, key_id], outcome="created", now=self._clock.now())
        return key_id, key

    def revoke_key(self, key_id: uuid.UUID, op: Operation | None = None) -> bool:
        """Revoke a key by id; False when it was already revoked (or, for a dry run, would be)."""
        with write_tx(self._engine) as conn:
            state = api_keys.state(conn, key_id)
            if state is None:
                raise NotFound(f"api key {key_id} not found")
            changed = state.revoked_at is None
            if changed and not (op and op.dry_run):
                api_keys.revoke(conn, key_id, self._clock.now())
            if op is not None:
                record(
                    conn, op, affected_ids=[key_id], outcome="revoked" if changed else "already", now=self._clock.now()
                )
        self._auth.forget(key_id=key_id)
        return changed

    def local_principal(self, name: str = "local") -> Principal:
        """Embedded mode's own user: the tenant `name` with a key, created with the default credits on first use."""
        with self._engine.connect() as conn:
            row = api_keys.named_tenant_key(conn, name)
        if row is None:
            tenant_id = self.create(name).id
        elif row.key_id is None:
            tenant_id = row.tenant_id
        else:
            return Principal(tenant_id=row.tenant_id, key_id=row.key_id)
        key_id, _ = self.create_key(tenant_id, name="embedded")
        return Principal(tenant_id=tenant_id, key_id=key_id)

    def cached_principal(self, key: str) -> Principal | None:
        """The principal of a key verified within `api.auth_cache_ttl_s`, without touching the database."""
        return self._auth.get(hash_key(key), self._clock.now().timestamp())

    def authenticate(self, key: str) -> Principal | None:
        """The tenant behind a live key of an active tenant, or None."""
        if not key.startswith(KEY_PREFIX) or len(key) > 128:
            return None
        digest, now = hash_key(key), self._clock.now().timestamp()
        cached = self._auth.get(digest, now)
        if cached is not None:
            return cached
        with read_conn(self._engine) as conn:
            row = api_keys.live_key(conn, digest)
        if row is None:
            return None
        principal = Principal(tenant_id=row.tenant_id, key_id=row.key_id)
        self._auth.put(digest, principal, now)
        return principal
