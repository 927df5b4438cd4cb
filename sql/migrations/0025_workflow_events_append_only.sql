-- workflow_task_events is a step's history (seed 004 §18: the per-task log a person reads to see why a step moved,
-- what it cost, which try failed), so like credit_ledger it is append-only in the database, not only by
-- convention: an UPDATE, a DELETE or a TRUNCATE is refused (also an operator's ad-hoc one).
-- One UPDATE stays allowed: the retention job's redaction (db/lifecycle.py), which sets `payload` to NULL and
-- touches nothing else, so the history keeps every move while its redacted summaries go.
CREATE FUNCTION workflow_task_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.payload IS NULL
       AND (NEW.id, NEW.workflow_task_id, NEW.project_id, NEW.event, NEW.from_status, NEW.to_status,
            NEW.error_code, NEW.created_at)
           IS NOT DISTINCT FROM
           (OLD.id, OLD.workflow_task_id, OLD.project_id, OLD.event, OLD.from_status, OLD.to_status,
            OLD.error_code, OLD.created_at) THEN
        RETURN NEW;  -- redaction: the payload dropped, the row otherwise as it was
    END IF;
    RAISE EXCEPTION 'workflow_task_events is append-only: % refused (only a redaction setting payload to NULL)', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE TRIGGER workflow_task_events_no_update_delete
    BEFORE UPDATE OR DELETE ON workflow_task_events
    FOR EACH ROW EXECUTE FUNCTION workflow_task_events_append_only();

CREATE TRIGGER workflow_task_events_no_truncate
    BEFORE TRUNCATE ON workflow_task_events
    FOR EACH STATEMENT EXECUTE FUNCTION workflow_task_events_append_only();
