-- Baseline schema for the pgbench create/transition scripts: performance_anchors.md Part B.2, verbatim.
-- Loaded into a throwaway database by `bench api_create`; never into an aivedio database.
CREATE TABLE task (
  id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant_id       bigint      NOT NULL,
  idempotency_key text        NOT NULL,
  status          text        NOT NULL,
  version         integer     NOT NULL DEFAULT 0,
  provider        text        NOT NULL,
  params          jsonb       NOT NULL,
  created_at      timestamptz NOT NULL DEFAULT now(),
  updated_at      timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT task_tenant_idem_uq UNIQUE (tenant_id, idempotency_key)
);
-- sweeper/reconciler index over non-terminal tasks (makes task UPDATEs non-HOT, as in production)
CREATE INDEX task_active_idx ON task (updated_at) WHERE status NOT IN ('SUCCEEDED','FAILED','CANCELLED');
CREATE TABLE credit_ledger (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, tenant_id bigint NOT NULL, task_id bigint NOT NULL,
  business_key text NOT NULL UNIQUE, entry_type text NOT NULL, amount bigint NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE task_state_event (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, task_id bigint NOT NULL, from_status text,
  to_status text NOT NULL, version integer NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX task_state_event_task_idx ON task_state_event (task_id, version);
CREATE TABLE outbox (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, aggregate_id bigint NOT NULL, topic text NOT NULL,
  payload jsonb NOT NULL, status text NOT NULL DEFAULT 'PENDING',
  created_at timestamptz NOT NULL DEFAULT now(), published_at timestamptz);
CREATE INDEX outbox_pending_idx ON outbox (id) WHERE status = 'PENDING';
CREATE TABLE inbox_dedup (
  provider text NOT NULL, event_id text NOT NULL, received_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (provider, event_id));

-- Seed (B.2): 100,000 existing tasks, then statistics.
INSERT INTO task (tenant_id, idempotency_key, status, version, provider, params)
SELECT 1 + (g % 1000), 'seed-' || g, 'PENDING', 0, 'provider_a',
       '{"prompt":"a red fox running through snow at dusk, cinematic, 35mm","duration_s":5,"resolution":"1080p","aspect":"16:9","seed":42}'
  FROM generate_series(1, 100000) AS g;
VACUUM ANALYZE;
