-- System B (seed 004): projects that run a multi-step workflow, one workflow_tasks row per step instance, and the
-- append-only history of every step transition. Statuses are the seed's own words (§4); the project status is
-- derived from its steps by the workflow service alone (§14).
CREATE TABLE projects (
    id               uuid          NOT NULL,
    tenant_id        uuid          NOT NULL,
    workflow         varchar(64)   NOT NULL,
    -- The client's end user this project is for: "one formal project per user at a time" (§10) counts by it.
    user_ref         varchar(128)  NOT NULL,
    -- §11: 1 premium custom, 2 paid formal, 3 preview, 4 free preview, 5 cleanup; 1 is served first.
    priority         smallint      NOT NULL DEFAULT 3,
    -- A formal (paid, final) production rather than a preview: the per-user limit counts these.
    formal           boolean       NOT NULL DEFAULT false,
    idempotency_key  varchar(255),
    input            jsonb         NOT NULL,
    input_hash       char(64)      NOT NULL,
    status           varchar(24)   NOT NULL DEFAULT 'created',
    -- CAS version: every status change and every lock grant bumps it; the project lock is fenced by it.
    version          integer       NOT NULL DEFAULT 1,
    -- Known once the plan step has run; per-shot steps are created then.
    shots            integer,
    cost_estimate    numeric(20,8) NOT NULL DEFAULT 0,
    cost_actual      numeric(20,8) NOT NULL DEFAULT 0,
    -- The project lock `lock:project:{id}:workflow` (§7) as a lease in the row: the step holding it and until
    -- when; a holder that died loses it at lock_until. The database stays the truth.
    lock_holder      uuid,
    lock_until       timestamptz,
    result_asset_id  uuid,
    error_code       varchar(64),
    created_at       timestamptz   NOT NULL,
    updated_at       timestamptz   NOT NULL,
    finished_at      timestamptz,
    CONSTRAINT pk_projects PRIMARY KEY (id),
    CONSTRAINT fk_projects_tenant_id FOREIGN KEY (tenant_id) REFERENCES tenants (id),
    CONSTRAINT fk_projects_result_asset_id FOREIGN KEY (result_asset_id) REFERENCES assets (id),
    CONSTRAINT uq_projects_tenant_id_idempotency_key UNIQUE (tenant_id, idempotency_key),
    CONSTRAINT ck_projects_status
        CHECK (status IN ('created', 'running', 'needs_attention', 'failed', 'succeeded', 'cancelled')),
    CONSTRAINT ck_projects_priority CHECK (priority BETWEEN 1 AND 5),
    CONSTRAINT ck_projects_shots_nonnegative CHECK (shots >= 0)
);
CREATE INDEX ix_projects_tenant_created ON projects (tenant_id, created_at);
-- §10: at most one open formal project per user of a tenant.
CREATE UNIQUE INDEX uq_projects_open_formal_user ON projects (tenant_id, user_ref)
    WHERE formal AND status IN ('created', 'running', 'needs_attention', 'failed');

CREATE TABLE workflow_tasks (
    id                   uuid          NOT NULL,
    project_id           uuid          NOT NULL,
    -- The step instance in the workflow definition: `plan`, `image[2]`.
    step_key             varchar(64)   NOT NULL,
    task_type            varchar(32)   NOT NULL,
    queue                varchar(32)   NOT NULL,
    priority             smallint      NOT NULL,
    provider_id          varchar(64),
    status               varchar(16)   NOT NULL DEFAULT 'pending',
    input_json           jsonb         NOT NULL,
    -- §6: project_id + task_type + input_hash is the idempotency key of a step.
    input_hash           char(64)      NOT NULL,
    output_asset_id      uuid,
    -- Small outputs (the plan's shots, a QC verdict) travel here; media goes to assets.
    output_json          jsonb,
    provider_request_id  varchar(255),
    -- A step that calls an AI vendor runs as a generation task (reservation, reconciliation, settlement).
    generation_task_id   uuid,
    retry_count          integer       NOT NULL DEFAULT 0,
    max_retry            integer       NOT NULL DEFAULT 3,
    next_attempt_at      timestamptz,
    progress             smallint      NOT NULL DEFAULT 0,
    cost_estimate        numeric(20,8) NOT NULL DEFAULT 0,
    cost_actual          numeric(20,8) NOT NULL DEFAULT 0,
    error_code           varchar(64),
    error_message        text,
    version              integer       NOT NULL DEFAULT 1,
    created_at           timestamptz   NOT NULL,
    started_at           timestamptz,
    finished_at          timestamptz,
    updated_at           timestamptz   NOT NULL,
    CONSTRAINT pk_workflow_tasks PRIMARY KEY (id),
    CONSTRAINT fk_workflow_tasks_project_id FOREIGN KEY (project_id) REFERENCES projects (id),
    CONSTRAINT fk_workflow_tasks_output_asset_id FOREIGN KEY (output_asset_id) REFERENCES assets (id),
    CONSTRAINT fk_workflow_tasks_generation_task_id FOREIGN KEY (generation_task_id) REFERENCES generation_tasks (id),
    CONSTRAINT uq_workflow_tasks_project_id_task_type_input_hash UNIQUE (project_id, task_type, input_hash),
    CONSTRAINT uq_workflow_tasks_project_id_step_key UNIQUE (project_id, step_key),
    CONSTRAINT ck_workflow_tasks_status
        CHECK (status IN ('pending', 'running', 'success', 'failed', 'retrying', 'cancelled', 'manual_required')),
    CONSTRAINT ck_workflow_tasks_task_type CHECK (task_type IN ('photo_check', 'person_profile', 'plan',
        'preview_image', 'final_image', 'image_qc', 'video_clip', 'tts', 'subtitles', 'bgm', 'composition',
        'final_qc', 'manual_review', 'delivery', 'cleanup', 'identity_anchor', 'face_consistency',
        'motion_portrait', 'real_video_clip', 'video_clip_qc', 'lipsync')),
    CONSTRAINT ck_workflow_tasks_queue CHECK (queue IN ('photo_check', 'text', 'image', 'video', 'voice', 'audio',
        'ffmpeg', 'qc', 'cleanup', 'notification', 'identity_anchor', 'face_consistency', 'motion_portrait',
        'real_video_clip', 'video_clip_qc', 'lipsync')),
    CONSTRAINT ck_workflow_tasks_error_code CHECK (error_code IN ('TASK_TIMEOUT', 'PROVIDER_TIMEOUT',
        'PROVIDER_RATE_LIMIT', 'PROVIDER_ERROR', 'INPUT_INVALID', 'PHOTO_QUALITY_FAIL', 'PAYMENT_REQUIRED',
        'QUOTA_NOT_ENOUGH', 'MODERATION_REJECTED', 'FFMPEG_FAILED', 'STORAGE_FAILED', 'UNKNOWN_ERROR',
        'PLAN_LIMIT_CONFLICT', 'IDENTITY_ANCHOR_NOT_CONFIRMED', 'FACE_CONSISTENCY_LOW',
        'REAL_VIDEO_PROVIDER_DISABLED', 'REAL_VIDEO_CONFIRMATION_REQUIRED', 'REAL_VIDEO_COST_LIMIT_EXCEEDED',
        'REAL_VIDEO_CLIP_FAILED', 'VIDEO_CLIP_QC_FAILED', 'LIPSYNC_FAILED', 'MINOR_MANUAL_REVIEW_REQUIRED',
        'MODERATION_WARNING')),
    CONSTRAINT ck_workflow_tasks_retry_count_nonnegative CHECK (retry_count >= 0)
);
-- The queue a worker claims from: due steps of one queue, best priority first.
CREATE INDEX ix_workflow_tasks_due ON workflow_tasks (queue, priority, next_attempt_at)
    WHERE status IN ('pending', 'retrying');
-- The sweeper's timeout scan (§13).
CREATE INDEX ix_workflow_tasks_running ON workflow_tasks (started_at) WHERE status = 'running';

CREATE TABLE workflow_task_events (
    id                uuid          NOT NULL,
    workflow_task_id  uuid          NOT NULL,
    project_id        uuid          NOT NULL,
    event             varchar(32)   NOT NULL,
    from_status       varchar(16),
    to_status         varchar(16)   NOT NULL,
    error_code        varchar(64),
    -- Redacted summaries (§18): input/output summary, provider, cost, duration, retries.
    payload           jsonb,
    created_at        timestamptz   NOT NULL,
    CONSTRAINT pk_workflow_task_events PRIMARY KEY (id),
    CONSTRAINT fk_workflow_task_events_workflow_task_id FOREIGN KEY (workflow_task_id) REFERENCES workflow_tasks (id),
    CONSTRAINT fk_workflow_task_events_project_id FOREIGN KEY (project_id) REFERENCES projects (id)
);
CREATE INDEX ix_workflow_task_events_project ON workflow_task_events (project_id, created_at);
