-- Client webhooks: a tenant's endpoints, and one delivery row per endpoint × task status change, which is the
-- delivery log (`aivedio webhooks deliveries`) and the retry schedule at once.
CREATE TABLE webhook_endpoints (
    id                  uuid          NOT NULL,
    tenant_id           uuid          NOT NULL,
    url                 text          NOT NULL,
    -- Task statuses this endpoint wants; an empty array means every status change.
    event_filter        jsonb         NOT NULL,
    -- The Standard Webhooks `whsec_` secret. Stored as is: signing needs the secret itself, not a hash.
    secret              text          NOT NULL,
    -- After a rotation the old secret keeps signing (a second signature) until previous_secret_until, so a
    -- receiver can switch without dropping a message.
    previous_secret     text,
    previous_secret_until timestamptz,
    created_at          timestamptz   NOT NULL,
    updated_at          timestamptz   NOT NULL,
    -- Removal is soft: the delivery log keeps naming the endpoint; its pending deliveries become DEAD.
    removed_at          timestamptz,
    CONSTRAINT pk_webhook_endpoints PRIMARY KEY (id),
    CONSTRAINT fk_webhook_endpoints_tenant_id FOREIGN KEY (tenant_id) REFERENCES tenants (id)
);

-- Fan-out reads the live endpoints of one tenant for every status change.
CREATE INDEX ix_webhook_endpoints_tenant_live ON webhook_endpoints (tenant_id) WHERE removed_at IS NULL;

CREATE TABLE webhook_deliveries (
    id                  uuid          NOT NULL,
    endpoint_id         uuid          NOT NULL,
    tenant_id           uuid          NOT NULL,
    -- The task.status.changed outbox event this delivery announces; with endpoint_id it makes fan-out
    -- idempotent under redelivery.
    event_id            uuid          NOT NULL,
    event_type          varchar(64)   NOT NULL,
    task_id             uuid          NOT NULL,
    -- The exact message body, so every attempt (and a replay) sends the same bytes under the same webhook-id.
    payload             jsonb         NOT NULL,
    state               varchar(16)   NOT NULL DEFAULT 'PENDING',
    attempts            integer       NOT NULL DEFAULT 0,
    -- When the next attempt is due; while an attempt runs, when its claim lapses (a crashed worker's attempt
    -- can then be taken over).
    next_attempt_at     timestamptz,
    first_attempt_at    timestamptz,
    last_attempt_at     timestamptz,
    last_status_code    integer,
    last_error          text,
    delivered_at        timestamptz,
    created_at          timestamptz   NOT NULL,
    updated_at          timestamptz   NOT NULL,
    CONSTRAINT pk_webhook_deliveries PRIMARY KEY (id),
    CONSTRAINT fk_webhook_deliveries_endpoint_id FOREIGN KEY (endpoint_id) REFERENCES webhook_endpoints (id),
    CONSTRAINT uq_webhook_deliveries_endpoint_id_event_id UNIQUE (endpoint_id, event_id),
    CONSTRAINT ck_webhook_deliveries_state CHECK (state IN ('PENDING', 'DELIVERED', 'FAILED', 'DEAD')),
    CONSTRAINT ck_webhook_deliveries_attempts_nonnegative CHECK (attempts >= 0)
);

-- The delivery log of one endpoint, newest first; and `replay webhooks` / the log filtered by state.
CREATE INDEX ix_webhook_deliveries_endpoint_created ON webhook_deliveries (endpoint_id, created_at);
CREATE INDEX ix_webhook_deliveries_state_next ON webhook_deliveries (state, next_attempt_at);
