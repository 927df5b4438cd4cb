"""Tenants and their API keys. Keys are shown once; only their SHA-256 is stored."""

from __future__ import annotations

import hashlib
import secrets
import threading
import uuid
from dataclasses import dataclass
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy import Engine

from aivedio_engine.clock import Clock, new_id
from aivedio_engine.config import Settings
from aivedio_engine.db import ledger
from aivedio_engine.db.session import read_conn, write_tx
from aivedio_engine.db.tables import api_keys, tenants
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


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: every query made on its behalf is scoped by `tenant_id`."""

    tenant_id: uuid.UUID
    key_id: uuid.UUID


def hash_key(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class _AuthCache:
    """Live keys seen recently, per process. A revoked key or a suspended tenant is refused by every process
    within `ttl_s`, and by this one at once; unknown keys are never cached, so a new key works immediately.
    Without it every request paid a connection checkout ending in ROLLBACK, which also throws away psycopg's
    prepared statements (research/performance_profile.md)."""

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
            if conn.execute(sa.select(tenants.c.id).where(tenants.c.name == name)).first():
                raise Conflict(f"a tenant named {name!r} already exists")
            if op is not None and op.dry_run:
                record(conn, op, affected_ids=[], outcome="would_create", now=now)
                return TenantView(tenant_id, name, TenantStatus.ACTIVE.value, amount, 0)
            conn.execute(
                tenants.insert().values(
                    id=tenant_id,
                    name=name,
                    status=TenantStatus.ACTIVE.value,
                    credit_balance=0,
                    max_concurrency=max_concurrency,
                    max_upload_bytes=max_upload_bytes,
                    created_at=now,
                    updated_at=now,
                )
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
        live_keys = (
            sa.select(sa.func.count())
            .where(api_keys.c.tenant_id == tenants.c.id, api_keys.c.revoked_at.is_(None))
            .scalar_subquery()
        )
        stmt = sa.select(tenants.c.id, tenants.c.name, tenants.c.status, tenants.c.credit_balance, live_keys).order_by(
            tenants.c.created_at
        )
        with self._engine.connect() as conn:
            return [TenantView(*row) for row in conn.execute(stmt)]

    def create_key(
        self, tenant_id: uuid.UUID, name: str | None = None, op: Operation | None = None
    ) -> tuple[uuid.UUID, str]:
        """Returns (key id, the key itself). The key is not stored and cannot be shown again."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        key_id = new_id()
        with write_tx(self._engine) as conn:
            if not conn.execute(sa.select(tenants.c.id).where(tenants.c.id == tenant_id)).first():
                raise NotFound(f"tenant {tenant_id} not found")
            if op is not None and op.dry_run:
                record(conn, op, affected_ids=[tenant_id], outcome="would_create", now=self._clock.now())
                return key_id, ""
            conn.execute(
                api_keys.insert().values(
                    id=key_id,
                    tenant_id=tenant_id,
                    key_hash=hash_key(key),
                    prefix=key[:12],
                    name=name,
                    created_at=self._clock.now(),
                )
            )
            if op is not None:  # the key itself is never recorded, only its id
                record(conn, op, affected_ids=[tenant_id, key_id], outcome="created", now=self._clock.now())
        return key_id, key

    def revoke_key(self, key_id: uuid.UUID, op: Operation | None = None) -> bool:
        """Revoke a key by id; False when it was already revoked (or, for a dry run, would be)."""
        with write_tx(self._engine) as conn:
            row = conn.execute(sa.select(api_keys.c.revoked_at).where(api_keys.c.id == key_id)).first()
            if row is None:
                raise NotFound(f"api key {key_id} not found")
            changed = row.revoked_at is None
            if changed and not (op and op.dry_run):
                conn.execute(api_keys.update().where(api_keys.c.id == key_id).values(revoked_at=self._clock.now()))
            if op is not None:
                record(
                    conn, op, affected_ids=[key_id], outcome="revoked" if changed else "already", now=self._clock.now()
                )
        self._auth.forget(key_id=key_id)
        return changed

    def local_principal(self, name: str = "local") -> Principal:
        """Embedded mode's own user: the tenant `name` with a key, created with the default credits on first use."""
        stmt = (
            sa.select(api_keys.c.id, tenants.c.id.label("tenant_id"))
            .join(
                api_keys, sa.and_(api_keys.c.tenant_id == tenants.c.id, api_keys.c.revoked_at.is_(None)), isouter=True
            )
            .where(tenants.c.name == name)
        )
        with self._engine.connect() as conn:
            row = conn.execute(stmt).first()
        if row is None:
            tenant_id = self.create(name).id
        elif row.id is None:
            tenant_id = row.tenant_id
        else:
            return Principal(tenant_id=row.tenant_id, key_id=row.id)
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
        stmt = (
            sa.select(api_keys.c.id, api_keys.c.tenant_id)
            .join(tenants, tenants.c.id == api_keys.c.tenant_id)
            .where(
                api_keys.c.key_hash == digest,
                api_keys.c.revoked_at.is_(None),
                tenants.c.status == TenantStatus.ACTIVE.value,
            )
        )
        with read_conn(self._engine) as conn:
            row = conn.execute(stmt).first()
        if row is None:
            return None
        principal = Principal(tenant_id=row.tenant_id, key_id=row.id)
        self._auth.put(digest, principal, now)
        return principal
