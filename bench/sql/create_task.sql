\set tenant random(1, 1000)
\set cost random(10, 500)
BEGIN;
INSERT INTO task (tenant_id, idempotency_key, status, version, provider, params)
  VALUES (:tenant, gen_random_uuid()::text, 'PENDING', 0, 'provider_a',
          '{"prompt":"a red fox running through snow at dusk, cinematic, 35mm","duration_s":5,"resolution":"1080p","aspect":"16:9","seed":42}')
  RETURNING id AS task_id \gset
INSERT INTO credit_ledger (tenant_id, task_id, business_key, entry_type, amount)
  VALUES (:tenant, :task_id, 'reserve:' || :task_id::text, 'RESERVE', :cost);
INSERT INTO task_state_event (task_id, from_status, to_status, version, payload)
  VALUES (:task_id, NULL, 'PENDING', 0, '{"reason":"created"}');
INSERT INTO outbox (aggregate_id, topic, payload)
  VALUES (:task_id, 'generation.submit', jsonb_build_object('task_id', :task_id::bigint, 'tenant_id', :tenant::bigint, 'provider', 'provider_a', 'version', 0));
COMMIT;
