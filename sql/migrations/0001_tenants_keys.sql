-- Tenants and their API keys.
--
-- Conventions for every migration (see sql/README.md): constraint names follow the mirror's naming convention
-- (pk_<table>, fk_<table>_<cols>, uq_<table>_<cols>, ck_<table>_<name>) so that errors name the same
-- constraint in PostgreSQL and in the embedded SQLite schema, and the drift test can compare by name.
-- Timestamps have no DEFAULT now(): the application takes time from an injected clock (DESIGN §4).

CREATE TABLE tenants (
    id                uuid          NOT NULL,
    name              varchar(128)  NOT NULL,
    status            varchar(16)   NOT NULL DEFAULT 'ACTIVE',
    -- A cache of SUM(credit_ledger.amount) for this tenant, updated in the same transaction as each ledger row
    -- while the tenant row is locked: the reservation check reads it under FOR UPDATE instead of summing.
    credit_balance    numeric(20,8) NOT NULL DEFAULT 0,
    -- NULL: use limits.tenant_default_max_concurrency from the config.
    max_concurrency   integer,
    -- Scheduling tier (seed 004 §11); higher is served first, round-robin within a tier.
    priority_tier     integer       NOT NULL DEFAULT 0,
    -- NULL: use api.tenant_rate_limit_per_s from the config.
    rate_limit_per_s  double precision,
    created_at        timestamptz   NOT NULL,
    updated_at        timestamptz   NOT NULL,
    CONSTRAINT pk_tenants PRIMARY KEY (id),
    CONSTRAINT uq_tenants_name UNIQUE (name),
    CONSTRAINT ck_tenants_status CHECK (status IN ('ACTIVE', 'SUSPENDED')),
    -- The last line of defence against overspending: a reservation that would go negative fails here even if
    -- the application check was skipped.
    CONSTRAINT ck_tenants_credit_balance_nonnegative CHECK (credit_balance >= 0),
    CONSTRAINT ck_tenants_max_concurrency_positive CHECK (max_concurrency > 0),
    CONSTRAINT ck_tenants_rate_limit_positive CHECK (rate_limit_per_s > 0)
);

CREATE TABLE api_keys (
    id            uuid         NOT NULL,
    tenant_id     uuid         NOT NULL,
    -- Only a hash of the secret is stored (SHA-256 of the full key): a leaked table does not leak keys, and the
    -- unique index makes lookup by presented key a single index probe.
    key_hash      bytea        NOT NULL,
    -- The first characters of the key, shown in listings so an operator can tell keys apart.
    prefix        varchar(16)  NOT NULL,
    name          varchar(128),
    created_at    timestamptz  NOT NULL,
    -- Revocation is a timestamp, not a DELETE: audit and "who used this key" questions stay answerable.
    revoked_at    timestamptz,
    last_used_at  timestamptz,
    CONSTRAINT pk_api_keys PRIMARY KEY (id),
    CONSTRAINT fk_api_keys_tenant_id FOREIGN KEY (tenant_id) REFERENCES tenants (id),
    CONSTRAINT uq_api_keys_key_hash UNIQUE (key_hash)
);

-- Listing a tenant's keys, and the FK check when a tenant row is touched.
CREATE INDEX ix_api_keys_tenant_id ON api_keys (tenant_id);
