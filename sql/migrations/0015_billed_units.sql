-- What the vendor billed for a job, as its terminal observation reported it (issue 10 item 5): settlement reads
-- these from the attempt instead of charging the estimate. NULL means "the vendor did not say": then the price
-- list × the requested seconds stands (Runway reports usage per account only).
--   vendor_billed    the vendor's verdict: charged or not (None: it did not say)
--   billed_seconds   output seconds the vendor charged (sim; Kling/Replicate/fal via vendor_unit_seconds)
--   billed_outputs   outputs the vendor charged
--   vendor_cost      the vendor's own charge figure, in its own unit (Kling units, Replicate/fal compute seconds)
--   vendor_refunded  the vendor gave the charge back (voided the job, failed it by its own moderation)
ALTER TABLE task_attempts
    ADD COLUMN vendor_billed    boolean,
    ADD COLUMN billed_seconds   numeric(12, 3),
    ADD COLUMN billed_outputs   integer,
    ADD COLUMN vendor_cost      numeric(20, 8),
    ADD COLUMN vendor_refunded  boolean,
    ADD CONSTRAINT ck_task_attempts_billed_nonnegative
        CHECK (billed_seconds >= 0 AND billed_outputs >= 0 AND vendor_cost >= 0);

-- An invoice line's own amount, beside the credits booked for it: a duplicate job the vendor charged us for is
-- booked at 0 credits to the tenant (never the tenant's fault) while the vendor's amount stays a real figure.
ALTER TABLE credit_ledger
    ADD COLUMN vendor_amount    numeric(20, 8),
    ADD COLUMN vendor_currency  varchar(16);
