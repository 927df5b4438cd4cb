-- The relay claims due rows in id order (`ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED`). With only the partial index
-- on available_at, PostgreSQL walks the primary key past every PUBLISHED row to find the PENDING ones: with 200k old
-- published rows the relay ran at 0.36 of its rate on an empty table (bench/run backlog). A partial index on id
-- holds only the PENDING rows, in claim order.
CREATE INDEX ix_outbox_events_pending_id ON outbox_events (id) WHERE status = 'PENDING';
