-- Jobs of the `local` provider (aivedio_engine/providers/local.py), which renders with ffmpeg inside an engine
-- process. They used to live only in that process's memory, so a render whose process died (killed hard, or a
-- command that exited before the render ended) left the engine polling a job nobody knew. A row outlives the
-- process: the next engine that asks for the job takes it over and renders it again under the same job id, and
-- the same request key always finds the same job, so a job is never rendered twice at once nor billed twice.
CREATE TABLE local_jobs (
    job_id         text         NOT NULL,
    -- The provider instance's configured name ([providers.<name>]); keys are unique per provider.
    provider       text         NOT NULL,
    request_key    text         NOT NULL,
    -- What to render: the clip spec, the prompt and the local path of the reference image, if any.
    params         jsonb        NOT NULL,
    -- The provider's normalised job status (providers/base.py JobStatus).
    state          text         NOT NULL,
    progress       integer      NOT NULL DEFAULT 0,
    -- The finished clip, renamed into place only once complete.
    output_path    text,
    size_bytes     bigint,
    error_code     text,
    error_message  text,
    -- "host:pid:start-time" of the process rendering it; NULL when no process holds it (it was released, or
    -- not started yet). A holder that is no longer alive lets the next asker take the job over.
    owner          text,
    -- How many renders were started for the job; bounds the re-renders of a job whose renders keep dying.
    renders        integer      NOT NULL DEFAULT 0,
    created_at     timestamptz  NOT NULL,
    updated_at     timestamptz  NOT NULL,
    CONSTRAINT pk_local_jobs PRIMARY KEY (job_id),
    CONSTRAINT uq_local_jobs_provider_request_key UNIQUE (provider, request_key),
    CONSTRAINT ck_local_jobs_state
        CHECK (state IN ('queued', 'throttled', 'running', 'succeeded', 'failed', 'canceled', 'aborted')),
    CONSTRAINT ck_local_jobs_counts_nonnegative CHECK (progress >= 0 AND renders >= 0)
);

-- What an engine starting up may have to take over.
CREATE INDEX ix_local_jobs_provider_state ON local_jobs (provider, state);
