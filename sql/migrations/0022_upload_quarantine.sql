-- Upload quarantine (seed 000 §4.12.1, issue 16 item 2): uploads land under tenants/{tid}/quarantine/, which no
-- signed URL can name; complete() validates there and publishes a copy to the consumable prefix. When the
-- quarantined object is gone (promoted, rejected and past its grace, or abandoned), the session records it, so the
-- sweeper knows what is left to delete and the orphan scan knows which quarantine keys a session still owns.

ALTER TABLE upload_sessions ADD COLUMN quarantine_cleared_at timestamptz;
CREATE INDEX ix_upload_sessions_quarantine_pending ON upload_sessions (created_at)
    WHERE quarantine_cleared_at IS NULL AND status <> 'OPEN';

-- Before this migration complete() and the abandoned-upload expiry deleted the staged object when they closed the
-- session: closed sessions have nothing left in quarantine.
UPDATE upload_sessions SET quarantine_cleared_at = coalesce(completed_at, expires_at) WHERE status <> 'OPEN';
