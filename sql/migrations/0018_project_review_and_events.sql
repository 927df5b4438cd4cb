-- System B interfaces: a review item may point at a workflow step (seed 004 §9: manual_required steps go to the
-- same review queue as held generation tasks), and every step transition and project status change gets a
-- per-project sequence number, so the project's event stream (`GET /v1/projects/{id}/events`) can be resumed
-- with Last-Event-ID.

-- Exactly one subject per item: a generation task or a workflow step.
ALTER TABLE review_items ALTER COLUMN task_id DROP NOT NULL;
ALTER TABLE review_items ADD COLUMN workflow_task_id uuid;
ALTER TABLE review_items ADD CONSTRAINT fk_review_items_workflow_task_id
    FOREIGN KEY (workflow_task_id) REFERENCES workflow_tasks (id);
ALTER TABLE review_items ADD CONSTRAINT ck_review_items_one_subject
    CHECK ((task_id IS NULL) <> (workflow_task_id IS NULL));
-- One open review per step, as per task: a step escalated twice in a row cannot queue itself twice.
CREATE UNIQUE INDEX uq_review_items_open_step ON review_items (workflow_task_id) WHERE state IN ('PENDING', 'CLAIMED');

-- The project's event counter: bumped by the UPDATE that also locks the project row, in the transaction that
-- appends the event, so sequence numbers become visible in order (a reader never sees 7 before 6 commits).
ALTER TABLE projects ADD COLUMN event_seq bigint NOT NULL DEFAULT 0;
ALTER TABLE workflow_task_events ADD COLUMN seq bigint;
-- The project's own status changes are numbered in the same history: a row without a step is one of them.
ALTER TABLE workflow_task_events ALTER COLUMN workflow_task_id DROP NOT NULL;
CREATE UNIQUE INDEX uq_workflow_task_events_project_seq ON workflow_task_events (project_id, seq);
