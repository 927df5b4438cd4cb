-- Retention and deletion (seed 000 §4.12.4/§4.12.6, issue 16 item 4): a tenant's own retention of outputs,
-- inputs and prompts (NULL: the [retention] default applies), when a task's prompt was redacted (by retention
-- or a purge), and when a tenant was purged.

ALTER TABLE tenants ADD COLUMN retention_outputs_days integer;
ALTER TABLE tenants ADD COLUMN retention_inputs_days integer;
ALTER TABLE tenants ADD COLUMN retention_prompts_days integer;
ALTER TABLE tenants ADD COLUMN purged_at timestamptz;
ALTER TABLE tenants ADD CONSTRAINT ck_tenants_retention_outputs_positive CHECK (retention_outputs_days > 0);
ALTER TABLE tenants ADD CONSTRAINT ck_tenants_retention_inputs_positive CHECK (retention_inputs_days > 0);
ALTER TABLE tenants ADD CONSTRAINT ck_tenants_retention_prompts_positive CHECK (retention_prompts_days > 0);

ALTER TABLE generation_tasks ADD COLUMN prompt_redacted_at timestamptz;
CREATE INDEX ix_generation_tasks_finished_unredacted ON generation_tasks (finished_at)
    WHERE finished_at IS NOT NULL AND prompt_redacted_at IS NULL;
