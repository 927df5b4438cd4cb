-- Transactional outbox and consumer inbox (seed 000 §4.6.4, §4.6.5; DESIGN §6).

-- Written in the same transaction as the state change it announces, so an event exists iff the change
-- committed. The relay publishes rows and may publish one twice; consumers dedupe through inbox_dedup.
CREATE TABLE outbox_events (
    id                 uuid          NOT NULL,
    aggregate_type     varchar(32)   NOT NULL,
    aggregate_id       uuid          NOT NULL,
    aggregate_version  bigint        NOT NULL,
    event_type         varchar(64)   NOT NULL,
    schema_version     integer       NOT NULL DEFAULT 1,
    -- Ids and scheduling summary only; never media, long prompts, secrets or raw provider responses.
    payload            jsonb         NOT NULL,
    status             varchar(16)   NOT NULL DEFAULT 'PENDING',
    -- The Dramatiq actor the relay enqueues this event to.
    target             varchar(128)  NOT NULL,
    -- Delayed delivery and relay back-off: not published before this time.
    available_at       timestamptz   NOT NULL,
    publish_attempts   integer       NOT NULL DEFAULT 0,
    last_error         text,
    -- No FK: system events have no tenant, and the outbox insert must stay cheap.
    tenant_id          uuid,
    trace_id           varchar(64),
    -- The event that caused this one, for tracing chains across consumers.
    causation_id       uuid,
    created_at         timestamptz   NOT NULL,
    published_at       timestamptz,
    CONSTRAINT pk_outbox_events PRIMARY KEY (id),
    CONSTRAINT ck_outbox_events_status CHECK (status IN ('PENDING', 'PUBLISHED', 'DEAD')),
    CONSTRAINT ck_outbox_events_publish_attempts_nonnegative CHECK (publish_attempts >= 0)
);

-- Operator views ("how many DEAD", "oldest PUBLISHED to purge").
CREATE INDEX ix_outbox_events_status_available ON outbox_events (status, available_at);
-- The relay's claim query (status = 'PENDING' AND available_at <= now() ... FOR UPDATE SKIP LOCKED) touches
-- only pending rows; published rows pile up and must not slow it down.
CREATE INDEX ix_outbox_events_pending ON outbox_events (available_at) WHERE status = 'PENDING';


-- One row per (consumer group, event) processed: inserted first in the consumer's transaction, so a
-- redelivered message hits the primary key and is acknowledged without a second effect.
CREATE TABLE inbox_dedup (
    consumer_group  varchar(64)   NOT NULL,
    event_id        uuid          NOT NULL,
    aggregate_id    uuid,
    processed_at    timestamptz   NOT NULL,
    -- Digest of what the consumer decided, to spot a replay that would decide differently.
    result_digest   varchar(128),
    CONSTRAINT pk_inbox_dedup PRIMARY KEY (consumer_group, event_id)
);

-- Retention purge of old rows.
CREATE INDEX ix_inbox_dedup_processed_at ON inbox_dedup (processed_at);
