-- Reconciliation of ambiguous submits (SUBMIT_UNKNOWN) needs its own history on the attempt: how many
-- lookups were made, when, and when the provider last answered "not found". "Not created" is only believed
-- from a lookup made well after the send (vendors can lag in showing a fresh job).

ALTER TABLE task_attempts
    ADD COLUMN lookup_count       integer      NOT NULL DEFAULT 0,
    ADD COLUMN last_lookup_at     timestamptz,
    ADD COLUMN last_not_found_at  timestamptz,
    ADD CONSTRAINT ck_task_attempts_lookup_count_nonnegative CHECK (lookup_count >= 0);

-- The reconciler's queue: ambiguous attempts whose next lookup is due.
CREATE INDEX ix_task_attempts_unknown ON task_attempts (last_lookup_at) WHERE submit_state = 'UNKNOWN';

-- The observation as the adapter normalised it (status, job id, outputs...). Kept beside the raw body so an
-- orphan callback can be replayed to the reducer once its job id is known, without re-verifying a signature
-- whose timestamp has long expired.
ALTER TABLE provider_events ADD COLUMN observation jsonb;
