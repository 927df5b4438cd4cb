-- The credit ledger: append-only, one row per booking, idempotent by business key (seed 000 §4.6.7).

CREATE TABLE credit_ledger (
    id            uuid          NOT NULL,
    tenant_id     uuid          NOT NULL,
    task_id       uuid,
    attempt_id    uuid,
    entry_type    varchar(16)   NOT NULL,
    -- Signed: RESERVE -estimate, SETTLE +estimate-actual, RELEASE +estimate, REFUND +, ADJUSTMENT +/-.
    -- tenants.credit_balance is the running sum of this column.
    amount        numeric(20,8) NOT NULL,
    unit          varchar(16)   NOT NULL DEFAULT 'credit',
    -- reserve:{task}, settle:{task}, release:{task}:{reason}, adjustment:{attempt}:{ref}: a repeated booking
    -- hits this unique key, and the unique violation means "already booked".
    business_key  varchar(255)  NOT NULL,
    reason        text,
    -- Service or operator that booked it; required so every credit movement is attributable.
    created_by    varchar(128)  NOT NULL,
    created_at    timestamptz   NOT NULL,
    CONSTRAINT pk_credit_ledger PRIMARY KEY (id),
    CONSTRAINT fk_credit_ledger_tenant_id FOREIGN KEY (tenant_id) REFERENCES tenants (id),
    CONSTRAINT fk_credit_ledger_task_id FOREIGN KEY (task_id) REFERENCES generation_tasks (id),
    CONSTRAINT fk_credit_ledger_attempt_id FOREIGN KEY (attempt_id) REFERENCES task_attempts (id),
    CONSTRAINT uq_credit_ledger_business_key UNIQUE (business_key),
    CONSTRAINT ck_credit_ledger_entry_type CHECK (entry_type IN ('RESERVE', 'SETTLE', 'RELEASE', 'REFUND', 'ADJUSTMENT')),
    -- The sign convention, enforced: a sign bug would otherwise silently mint or burn credits.
    CONSTRAINT ck_credit_ledger_amount_sign CHECK (
        (entry_type <> 'RESERVE' OR amount <= 0) AND (entry_type NOT IN ('RELEASE', 'REFUND') OR amount >= 0))
);

CREATE INDEX ix_credit_ledger_tenant_created ON credit_ledger (tenant_id, created_at);
CREATE INDEX ix_credit_ledger_task_id ON credit_ledger (task_id);

-- Corrections are new ADJUSTMENT rows, never edits: history must be reproducible for audits and disputes.
-- The trigger makes that a database guarantee rather than a code convention (it also stops an operator's
-- ad-hoc UPDATE). TRUNCATE is refused too.
CREATE FUNCTION credit_ledger_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'credit_ledger is append-only: % refused; book an ADJUSTMENT instead', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE TRIGGER credit_ledger_no_update_delete
    BEFORE UPDATE OR DELETE ON credit_ledger
    FOR EACH ROW EXECUTE FUNCTION credit_ledger_append_only();

CREATE TRIGGER credit_ledger_no_truncate
    BEFORE TRUNCATE ON credit_ledger
    FOR EACH STATEMENT EXECUTE FUNCTION credit_ledger_append_only();
