-- The sweeper looks every pass for provider observations stored but never applied (their message was lost) among
-- those received in the last days before its budget (services/keep_moving.py, db/stalled.py): by received_at.
CREATE INDEX ix_provider_events_received_at ON provider_events (received_at);
