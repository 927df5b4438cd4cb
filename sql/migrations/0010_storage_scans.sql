-- Results of the orphan object scan (seed 000 §4.10.7 orphan_object_count): objects in our own storage that no
-- row references (a fetch that crashed after its PUT, a media run that failed after uploading). Counting them
-- means listing the whole bucket, which is far too slow and costly to do at every Prometheus scrape, so the
-- sweeper (or `aivedio storage scan`) lists it now and then and records the outcome here; /metrics reads the
-- newest row.
CREATE TABLE storage_scans (
    id            uuid         NOT NULL,
    started_at    timestamptz  NOT NULL,
    finished_at   timestamptz  NOT NULL,
    objects       bigint       NOT NULL,
    bytes         bigint       NOT NULL,
    orphans       bigint       NOT NULL,
    orphan_bytes  bigint       NOT NULL,
    -- Up to 100 orphan keys, for a first look without running the scan again.
    sample        jsonb,
    -- Set when the listing or the lookups failed; the counts are then 0 and mean nothing.
    error         text,
    CONSTRAINT pk_storage_scans PRIMARY KEY (id),
    CONSTRAINT ck_storage_scans_counts_nonnegative
        CHECK (objects >= 0 AND bytes >= 0 AND orphans >= 0 AND orphan_bytes >= 0)
);

-- The newest scan: what /metrics and the sweeper's "is a scan due?" read.
CREATE INDEX ix_storage_scans_finished_at ON storage_scans (finished_at);
