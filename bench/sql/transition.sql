\set tid random(1, 100000)
BEGIN;
INSERT INTO inbox_dedup (provider, event_id) VALUES ('provider_a', gen_random_uuid()::text);
SELECT status, version AS ver FROM task WHERE id = :tid \gset
UPDATE task SET status = 'RUNNING', version = version + 1, updated_at = now()
  WHERE id = :tid AND version = :ver;
INSERT INTO task_state_event (task_id, from_status, to_status, version, payload)
  VALUES (:tid, :status, 'RUNNING', :ver + 1, '{"provider_status":"processing","progress":0.42}');
INSERT INTO outbox (aggregate_id, topic, payload)
  VALUES (:tid, 'generation.status', jsonb_build_object('task_id', :tid::bigint, 'status', 'RUNNING', 'version', :ver + 1));
COMMIT;
