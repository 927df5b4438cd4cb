-- Tenant limits an operator sets with `aivedio tenants update` (rate, burst, concurrency, tier, upload cap).
--
-- The request rate limit is a token bucket per tenant in front of POST /v1/generations: `rate_limit_per_s`
-- tokens per second refill a bucket of `rate_limit_burst` tokens. NULL takes the config's default
-- (api.tenant_rate_burst), so a change of the default reaches every tenant that was never given its own.

ALTER TABLE tenants ADD COLUMN rate_limit_burst integer;
ALTER TABLE tenants ADD CONSTRAINT ck_tenants_rate_limit_burst_positive CHECK (rate_limit_burst > 0);

-- Migration 0001's comment on priority_tier said a higher tier is served first. The dispatcher has always done
-- the opposite, as seed 004 §11 orders them: 1 custom project, 2 paid, 3 preview, 4 free preview, 5 cleanup,
-- and tier 1 is served first. The column defaulted to 0, which nothing could set and which the dispatcher read
-- as tier 2 (paid); it now says so, and only the seed's tiers are accepted.
UPDATE tenants SET priority_tier = 2 WHERE priority_tier NOT BETWEEN 1 AND 5;
ALTER TABLE tenants ALTER COLUMN priority_tier SET DEFAULT 2;
ALTER TABLE tenants ADD CONSTRAINT ck_tenants_priority_tier_range CHECK (priority_tier BETWEEN 1 AND 5);

COMMENT ON COLUMN tenants.priority_tier IS
    'Scheduling tier (seed 004 §11): 1 custom project, 2 paid, 3 preview, 4 free preview, 5 cleanup. '
    'A LOWER number is served first (strict tiers, round-robin between tenants within a tier); a request''s '
    'priority can only ask for this tier or a worse one.';
COMMENT ON COLUMN tenants.rate_limit_per_s IS
    'Token-bucket refill rate for POST /v1/generations (requests/s). NULL: api.tenant_rate_limit_per_s.';
COMMENT ON COLUMN tenants.rate_limit_burst IS
    'Token-bucket size for POST /v1/generations (requests at once). NULL: api.tenant_rate_burst.';
COMMENT ON COLUMN tenants.max_concurrency IS
    'Tasks of this tenant in flight at a provider at once. NULL: limits.tenant_default_max_concurrency.';
