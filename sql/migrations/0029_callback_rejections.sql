-- Provider callbacks that failed verification, counted per provider, reason and window (`[alerts]
-- callback_verify_window_s`): the request proved nothing about its sender, so nothing of it is kept but the reason
-- and the last one's one-line detail, and a flood of forgeries bumps one row instead of adding one per request.
-- The alert rule `callback_verify_failures` and the audit's I10.4 read the windows.
CREATE TABLE callback_rejections (
    id            uuid          NOT NULL,
    provider      varchar(64)   NOT NULL,
    reason        varchar(32)   NOT NULL,
    window_start  timestamptz   NOT NULL,
    failures      integer       NOT NULL,
    first_at      timestamptz   NOT NULL,
    last_at       timestamptz   NOT NULL,
    detail        text          NOT NULL,
    CONSTRAINT pk_callback_rejections PRIMARY KEY (id),
    CONSTRAINT uq_callback_rejections_provider_reason_window_start UNIQUE (provider, reason, window_start),
    CONSTRAINT ck_callback_rejections_reason CHECK (reason IN ('signature', 'timestamp', 'not_configured', 'malformed')),
    CONSTRAINT ck_callback_rejections_failures_positive CHECK (failures >= 1)
);

-- The alert rule reads the two newest windows of every provider.
CREATE INDEX ix_callback_rejections_window_start ON callback_rejections (window_start);
