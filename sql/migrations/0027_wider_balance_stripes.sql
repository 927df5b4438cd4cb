-- 64 balance stripes instead of 16, and one index fewer on every outbox insert.
--
-- Stripes: with 16, the creations of one busy tenant still met on a stripe often (16 clients over 16 stripes: most
-- of them find theirs held by another until its commit has been flushed); our own create transaction ran at 0.40
-- of the minimal one with 1 tenant against 0.46 with 16 tenants. pgbench of the same captured transaction with 64
-- stripes: +10 % with 1 tenant, level with 16 tenants (bench/README.md). Nothing moves: the existing 16 rows keep
-- their credits; a tenant's other 48 rows are made by its next spread (db/balances.py), and until then a debit whose
-- stripe has no row takes the spreading path, as a short stripe does.
--
-- Outbox: ix_outbox_events_status_available (status, available_at) took an entry for every PENDING insert, which
-- the two partial PENDING indexes (0004, 0024) already serve. What read it besides them: the audit's DEAD rows and
-- the retention's purge of PUBLISHED rows by published_at; each gets a partial index of its own, which a new
-- (PENDING) row does not enter.
ALTER TABLE tenant_balance_stripes DROP CONSTRAINT ck_tenant_balance_stripes_stripe_range;
ALTER TABLE tenant_balance_stripes ADD CONSTRAINT ck_tenant_balance_stripes_stripe_range CHECK (stripe >= 0 AND stripe < 64);

DROP INDEX ix_outbox_events_status_available;
CREATE INDEX ix_outbox_events_published ON outbox_events (published_at) WHERE status = 'PUBLISHED';
CREATE INDEX ix_outbox_events_dead ON outbox_events (id) WHERE status = 'DEAD';
