-- Liveness: one row per running aivedio process (`serve --role ...`, or the engine embedded in a command), written
-- by the process itself every few seconds. Operators read it (`aivedio status`, the TUI overview) and the
-- role_missing alert rule compares it with the work waiting; a row never says more than "seen at last_seen".
CREATE TABLE process_heartbeats (
    id           uuid          NOT NULL,
    -- Comma list of the roles this process runs (api, relay, worker, scheduler, sweeper), sorted.
    roles        varchar(128)  NOT NULL,
    host         varchar(255)  NOT NULL,
    pid          integer       NOT NULL,
    version      varchar(64)   NOT NULL,
    -- "serve", or the command that hosts the embedded engine (generate, generations wait, batch run).
    kind         varchar(32)   NOT NULL,
    started_at   timestamptz   NOT NULL,
    last_seen    timestamptz   NOT NULL,
    -- Set on a clean shutdown; a process that died keeps NULL here and only its last_seen ages.
    stopped_at   timestamptz,
    -- What the process is doing, in words, per role.
    activity     jsonb,
    -- The backlog it saw at its last beat (pending outbox rows, queued tasks, ...).
    backlog      jsonb,
    CONSTRAINT pk_process_heartbeats PRIMARY KEY (id),
    CONSTRAINT ck_process_heartbeats_pid_positive CHECK (pid > 0)
);
-- `status` and the alert rule read the recent rows; old rows are pruned by last_seen.
CREATE INDEX ix_process_heartbeats_last_seen ON process_heartbeats (last_seen);
