-- A tenant's plan may cap uploads below (or above) the platform's api.max_upload_bytes (U2 of the upload abuse
-- corpus: a declared size above the tenant's maximum is refused with 413 before any URL is handed out).
-- NULL: the platform cap applies.

ALTER TABLE tenants ADD COLUMN max_upload_bytes bigint;
ALTER TABLE tenants ADD CONSTRAINT ck_tenants_max_upload_bytes_positive CHECK (max_upload_bytes > 0);
