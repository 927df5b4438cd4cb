-- Operations: manual review, dead letters, slot leases with fencing tokens, alerts and the audit log.

CREATE TABLE review_items (
    id             uuid          NOT NULL,
    task_id        uuid          NOT NULL,
    asset_id       uuid,
    reason         text          NOT NULL,
    state          varchar(16)   NOT NULL DEFAULT 'PENDING',
    -- A claim is a lease: a reviewer who walks away loses it at claimed_until and the item is claimable again.
    claimed_by     varchar(128),
    claimed_until  timestamptz,
    decision       varchar(16),
    decided_by     varchar(128),
    decided_at     timestamptz,
    note           text,
    created_at     timestamptz   NOT NULL,
    CONSTRAINT pk_review_items PRIMARY KEY (id),
    CONSTRAINT fk_review_items_task_id FOREIGN KEY (task_id) REFERENCES generation_tasks (id),
    CONSTRAINT fk_review_items_asset_id FOREIGN KEY (asset_id) REFERENCES assets (id),
    CONSTRAINT ck_review_items_state CHECK (state IN ('PENDING', 'CLAIMED', 'APPROVED', 'REJECTED')),
    CONSTRAINT ck_review_items_decision CHECK (decision IN ('APPROVED', 'REJECTED'))
);

-- One open review per task: a redelivered "review required" event cannot queue the task twice.
CREATE UNIQUE INDEX uq_review_items_open_task ON review_items (task_id) WHERE state IN ('PENDING', 'CLAIMED');
-- The reviewers' queue, oldest first.
CREATE INDEX ix_review_items_open_created ON review_items (created_at) WHERE state IN ('PENDING', 'CLAIMED');


-- Every message Dramatiq gave up on. Redis forgets dead letters after 7 days; this table does not.
CREATE TABLE dead_letters (
    id              uuid          NOT NULL,
    -- The broker message id (= outbox event id for relayed events): the same message dying again bumps
    -- seen_count instead of adding a row.
    message_id      varchar(64)   NOT NULL,
    actor           varchar(128)  NOT NULL,
    queue           varchar(64)   NOT NULL,
    message         jsonb         NOT NULL,
    error           text,
    -- Only the tail: the useful frames, without unbounded row growth.
    traceback_tail  text,
    first_seen_at   timestamptz   NOT NULL,
    last_seen_at    timestamptz   NOT NULL,
    seen_count      integer       NOT NULL DEFAULT 1,
    replayed_at     timestamptz,
    CONSTRAINT pk_dead_letters PRIMARY KEY (id),
    CONSTRAINT uq_dead_letters_message_id UNIQUE (message_id),
    CONSTRAINT ck_dead_letters_seen_count_positive CHECK (seen_count >= 1)
);

-- `aivedio replay` lists what has not been replayed yet.
CREATE INDEX ix_dead_letters_not_replayed ON dead_letters (last_seen_at) WHERE replayed_at IS NULL;


-- Fencing tokens only grow (NO CYCLE): a holder whose lease expired carries a token lower than the current
-- holder's, and writes guarded by "token >= current" reject it. Values are never reused even on rollback.
CREATE SEQUENCE fencing_token_seq AS bigint START WITH 1 INCREMENT BY 1 NO CYCLE;

-- Slot leases (concurrency limits) when PostgreSQL, not Redis, is the slot store; also the history that the
-- slot reconciler compares against active attempts.
CREATE TABLE slot_grants (
    id                uuid          NOT NULL,
    -- e.g. platform, tenant:{id}, provider:{name}, model:{provider}/{model}
    scope             varchar(128)  NOT NULL,
    holder            varchar(128)  NOT NULL,
    fencing_token     bigint        NOT NULL,
    lease_expires_at  timestamptz   NOT NULL,
    released_at       timestamptz,
    created_at        timestamptz   NOT NULL,
    CONSTRAINT pk_slot_grants PRIMARY KEY (id),
    -- Tokens come from fencing_token_seq; two grants with one token would defeat fencing.
    CONSTRAINT uq_slot_grants_fencing_token UNIQUE (fencing_token)
);

-- Counting live leases per scope: released grants are history and stay out of the index.
CREATE INDEX ix_slot_grants_active ON slot_grants (scope, lease_expires_at) WHERE released_at IS NULL;


CREATE TABLE alerts (
    id               uuid          NOT NULL,
    rule             varchar(64)   NOT NULL,
    severity         varchar(16)   NOT NULL,
    status           varchar(16)   NOT NULL DEFAULT 'OPEN',
    subject_type     varchar(32),
    subject_id       varchar(128),
    -- What makes two firings "the same alert" (e.g. the task id): a repeat bumps last_seen_at.
    dedup_key        varchar(255)  NOT NULL,
    message          text          NOT NULL,
    details          jsonb,
    raised_at        timestamptz   NOT NULL,
    last_seen_at     timestamptz   NOT NULL,
    acknowledged_by  varchar(128),
    acknowledged_at  timestamptz,
    resolved_at      timestamptz,
    CONSTRAINT pk_alerts PRIMARY KEY (id),
    CONSTRAINT ck_alerts_severity CHECK (severity IN ('info', 'warning', 'critical')),
    CONSTRAINT ck_alerts_status CHECK (status IN ('OPEN', 'ACKNOWLEDGED', 'RESOLVED'))
);

-- At most one unresolved alert per rule and subject; once resolved, the same condition may raise a new one.
CREATE UNIQUE INDEX uq_alerts_open_rule_dedup_key ON alerts (rule, dedup_key) WHERE status <> 'RESOLVED';
CREATE INDEX ix_alerts_status_raised ON alerts (status, raised_at);


-- Every operator command that changes state (reconcile, replay, ledger adjust, ...), including dry runs.
CREATE TABLE audit_log (
    id            uuid          NOT NULL,
    actor         varchar(128)  NOT NULL,
    command       varchar(128)  NOT NULL,
    reason        text,
    args          jsonb         NOT NULL,
    affected_ids  jsonb,
    outcome       varchar(32)   NOT NULL,
    dry_run       boolean       NOT NULL DEFAULT false,
    created_at    timestamptz   NOT NULL,
    CONSTRAINT pk_audit_log PRIMARY KEY (id)
);

CREATE INDEX ix_audit_log_created_at ON audit_log (created_at);
