-- Generation tasks, provider attempts, the task history and raw provider observations (seed 000 §4.6.1-4.6.3).

CREATE TABLE generation_tasks (
    id                      uuid          NOT NULL,
    tenant_id               uuid          NOT NULL,
    -- Nullable: bearer API keys map to a tenant, not to a user; front ends may pass a user through.
    user_id                 uuid,
    project_id              uuid,
    -- The client's Idempotency-Key header, unique per tenant (RFC draft allows up to 255 characters).
    client_idempotency_key  varchar(255)  NOT NULL,
    -- SHA-256 of the normalized request: the same key with a different body is a 409, never the old task.
    request_hash            bytea         NOT NULL,
    status                  varchar(32)   NOT NULL,
    -- Optimistic concurrency: every transition is UPDATE ... WHERE id = ? AND version = ?.
    version                 bigint        NOT NULL DEFAULT 0,
    -- Display only (max of observed values); never drives status.
    progress                smallint      NOT NULL DEFAULT 0,
    requested_model         varchar(64)   NOT NULL,
    selected_provider       varchar(64),
    current_attempt_no      integer       NOT NULL DEFAULT 0,
    priority                integer       NOT NULL DEFAULT 0,
    estimated_cost          numeric(20,8) NOT NULL,
    reserved_amount         numeric(20,8) NOT NULL DEFAULT 0,
    actual_cost             numeric(20,8),
    -- FK to assets is added in 0003, once assets exists (the two tables reference each other).
    output_asset_id         uuid,
    prompt                  text          NOT NULL,
    -- The normalized request (model, resolution, duration, input asset ids ...), the input of request_hash.
    params                  jsonb         NOT NULL,
    next_retry_at           timestamptz,
    deadline_at             timestamptz,
    cancel_requested_at     timestamptz,
    cancel_outcome          varchar(32),
    last_error_class        varchar(32),
    last_error_code         varchar(128),
    -- Non-terminal but needing a human (e.g. SUBMIT_UNKNOWN past the reconcile window); NULL when not parked.
    parked_reason           text,
    -- When the sweeper must look at this task again; the recovery scan reads only this column's index.
    next_action_at          timestamptz,
    -- NULL: no review involved; otherwise the state of the task's current review item.
    review_state            varchar(16),
    trace_id                varchar(64),
    created_at              timestamptz   NOT NULL,
    updated_at              timestamptz   NOT NULL,
    started_at              timestamptz,
    finished_at             timestamptz,
    CONSTRAINT pk_generation_tasks PRIMARY KEY (id),
    CONSTRAINT fk_generation_tasks_tenant_id FOREIGN KEY (tenant_id) REFERENCES tenants (id),
    -- The idempotency boundary of POST /v1/generations (DESIGN §6); also serves listing by tenant.
    CONSTRAINT uq_generation_tasks_tenant_id_client_idempotency_key UNIQUE (tenant_id, client_idempotency_key),
    CONSTRAINT ck_generation_tasks_status CHECK (status IN (
        'CREATED', 'VALIDATING', 'QUOTA_RESERVED', 'QUEUED', 'DISPATCHING', 'SUBMITTED', 'RUNNING',
        'OUTPUT_FETCHING', 'POST_PROCESSING', 'SUCCEEDED', 'SUBMIT_UNKNOWN', 'RETRY_WAIT', 'CANCEL_REQUESTED',
        'CANCELED', 'FAILED_FINAL', 'EXPIRED', 'MANUAL_REVIEW')),
    CONSTRAINT ck_generation_tasks_cancel_outcome CHECK (cancel_outcome IN ('CANCELED', 'TOO_LATE', 'UNSUPPORTED')),
    CONSTRAINT ck_generation_tasks_review_state CHECK (review_state IN ('PENDING', 'CLAIMED', 'APPROVED', 'REJECTED')),
    CONSTRAINT ck_generation_tasks_progress_range CHECK (progress BETWEEN 0 AND 100),
    CONSTRAINT ck_generation_tasks_version_nonnegative CHECK (version >= 0),
    CONSTRAINT ck_generation_tasks_attempt_no_nonnegative CHECK (current_attempt_no >= 0),
    CONSTRAINT ck_generation_tasks_costs_nonnegative
        CHECK (estimated_cost >= 0 AND reserved_amount >= 0 AND actual_cost >= 0)
);

-- Partial indexes for the scans that drive recovery: terminal tasks (the vast majority over time) are not in
-- them, so the indexes stay small and the sweeper's scan cost follows the number of live tasks.
CREATE INDEX ix_generation_tasks_next_action_active ON generation_tasks (next_action_at)
    WHERE status NOT IN ('SUCCEEDED', 'CANCELED', 'FAILED_FINAL', 'EXPIRED');
CREATE INDEX ix_generation_tasks_next_retry ON generation_tasks (next_retry_at)
    WHERE status = 'RETRY_WAIT';
-- GET /v1/generations: newest first, per tenant.
CREATE INDEX ix_generation_tasks_tenant_created ON generation_tasks (tenant_id, created_at DESC);
-- The dispatcher's queue: highest priority first, FIFO within a priority.
CREATE INDEX ix_generation_tasks_queued ON generation_tasks (priority DESC, created_at)
    WHERE status = 'QUEUED';


CREATE TABLE task_attempts (
    id                         uuid          NOT NULL,
    task_id                    uuid          NOT NULL,
    attempt_no                 integer       NOT NULL,
    provider                   varchar(64)   NOT NULL,
    model                      varchar(64)   NOT NULL,
    -- Derived from the attempt id and sent to the provider so it can dedupe a repeated submit.
    provider_request_key       varchar(128)  NOT NULL,
    provider_job_id            varchar(256),
    submit_state               varchar(32)   NOT NULL,
    request_fingerprint        bytea         NOT NULL,
    provider_error_code        varchar(128),
    provider_updated_at        timestamptz,
    submitted_at               timestamptz,
    completed_at               timestamptz,
    -- When the poller should query this attempt next; only ACKED/RUNNING attempts are in its index.
    next_poll_at               timestamptz,
    poll_count                 integer       NOT NULL DEFAULT 0,
    -- Provider output URLs expire; fetching after this needs a fresh URL from a query.
    output_url_expires_at      timestamptz,
    -- This attempt was created after an earlier one ended UNKNOWN: a duplicate provider job is possible.
    resubmitted_after_unknown  boolean       NOT NULL DEFAULT false,
    -- Lease token of the dispatcher slot that sent it; a write carrying an older token is rejected.
    fencing_token              bigint,
    last_error_class           varchar(32),
    created_at                 timestamptz   NOT NULL,
    updated_at                 timestamptz   NOT NULL,
    CONSTRAINT pk_task_attempts PRIMARY KEY (id),
    CONSTRAINT fk_task_attempts_task_id FOREIGN KEY (task_id) REFERENCES generation_tasks (id),
    -- "Read, never re-create": a retried dispatch finds the attempt it already made.
    CONSTRAINT uq_task_attempts_task_id_attempt_no UNIQUE (task_id, attempt_no),
    CONSTRAINT uq_task_attempts_provider_provider_request_key UNIQUE (provider, provider_request_key),
    CONSTRAINT ck_task_attempts_submit_state CHECK (submit_state IN (
        'NEW', 'SENDING', 'ACKED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELED', 'UNKNOWN', 'FAILED_BEFORE_ACCEPT')),
    CONSTRAINT ck_task_attempts_attempt_no_positive CHECK (attempt_no >= 1),
    CONSTRAINT ck_task_attempts_poll_count_nonnegative CHECK (poll_count >= 0)
);

-- A plain UNIQUE would also work (NULLs are distinct) but the partial index skips the many NULL rows of
-- attempts that never got a job id (seed §4.6.2).
CREATE UNIQUE INDEX uq_task_attempts_provider_job ON task_attempts (provider, provider_job_id)
    WHERE provider_job_id IS NOT NULL;
-- At most one attempt per task that may hold or be about to create a provider job: a second dispatch racing
-- the first fails here instead of paying the provider twice.
CREATE UNIQUE INDEX uq_task_attempts_one_in_flight ON task_attempts (task_id)
    WHERE submit_state IN ('NEW', 'SENDING', 'ACKED', 'RUNNING', 'UNKNOWN');
CREATE INDEX ix_task_attempts_next_poll ON task_attempts (next_poll_at)
    WHERE submit_state IN ('ACKED', 'RUNNING');


-- Append-only task history. Ignored observations (duplicate, stale, illegal, anomaly) are recorded too, so
-- "why did this task not move" is answerable from this table alone.
CREATE TABLE task_state_events (
    id                   uuid          NOT NULL,
    task_id              uuid          NOT NULL,
    attempt_id           uuid,
    source               varchar(16)   NOT NULL,
    -- Provider event id, or a stable fingerprint of (provider, job, status, provider_updated_at, payload hash).
    source_event_id      varchar(255)  NOT NULL,
    event_type           varchar(64)   NOT NULL,
    from_status          varchar(32),
    to_status            varchar(32),
    -- The task version the decision was made against (the new version when applied).
    task_version         bigint        NOT NULL,
    provider_updated_at  timestamptz,
    observed_at          timestamptz   NOT NULL,
    -- Bounded and redacted by the writer: no secrets, no full provider responses.
    payload              jsonb,
    outcome              varchar(16)   NOT NULL,
    created_at           timestamptz   NOT NULL,
    CONSTRAINT pk_task_state_events PRIMARY KEY (id),
    CONSTRAINT fk_task_state_events_task_id FOREIGN KEY (task_id) REFERENCES generation_tasks (id),
    CONSTRAINT fk_task_state_events_attempt_id FOREIGN KEY (attempt_id) REFERENCES task_attempts (id),
    -- The same callback or poll result delivered twice produces no second transition.
    CONSTRAINT uq_task_state_events_source_source_event_id UNIQUE (source, source_event_id),
    CONSTRAINT ck_task_state_events_source CHECK (source IN (
        'api', 'scheduler', 'callback', 'polling', 'worker', 'sweeper', 'admin')),
    CONSTRAINT ck_task_state_events_outcome CHECK (outcome IN ('applied', 'duplicate', 'stale', 'illegal', 'anomaly'))
);

CREATE INDEX ix_task_state_events_task_version ON task_state_events (task_id, task_version);


-- Every raw callback and poll observation as received, before any interpretation: evidence for disputes with
-- the provider, and the input of replay. Rows expire (expires_at) and are purged by the sweeper.
CREATE TABLE provider_events (
    id                    uuid          NOT NULL,
    provider              varchar(64)   NOT NULL,
    source                varchar(16)   NOT NULL,
    webhook_id            varchar(255),
    -- The webhook id, or a stable fingerprint when the provider sends none.
    dedup_key             varchar(255)  NOT NULL,
    -- False rows are kept (signature failures are worth an alert) but never drive a transition.
    verified              boolean       NOT NULL DEFAULT false,
    headers_digest        varchar(128),
    -- The raw body, capped by webhooks.max_body_bytes; bytes because signatures are over exact bytes.
    body                  bytea,
    provider_job_id       varchar(256),
    provider_request_key  varchar(128),
    matched_attempt_id    uuid,
    -- A callback for a job we do not know yet (it can arrive before the submit response is recorded).
    orphan                boolean       NOT NULL DEFAULT false,
    received_at           timestamptz   NOT NULL,
    expires_at            timestamptz   NOT NULL,
    CONSTRAINT pk_provider_events PRIMARY KEY (id),
    CONSTRAINT fk_provider_events_matched_attempt_id FOREIGN KEY (matched_attempt_id) REFERENCES task_attempts (id),
    CONSTRAINT uq_provider_events_provider_dedup_key UNIQUE (provider, dedup_key),
    CONSTRAINT ck_provider_events_source CHECK (source IN ('callback', 'polling'))
);

-- Orphans are re-matched when the submit response lands; only they need this lookup.
CREATE INDEX ix_provider_events_orphan ON provider_events (provider, provider_job_id) WHERE orphan;
CREATE INDEX ix_provider_events_expires_at ON provider_events (expires_at);
