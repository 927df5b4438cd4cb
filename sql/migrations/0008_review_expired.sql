-- A task that passes its deadline while waiting for a reviewer is EXPIRED by the sweeper; its review item must
-- close with it (EXPIRED), or the review queue would list work nobody can act on any more.

ALTER TABLE review_items DROP CONSTRAINT ck_review_items_state;
ALTER TABLE review_items ADD CONSTRAINT ck_review_items_state
    CHECK (state IN ('PENDING', 'CLAIMED', 'APPROVED', 'REJECTED', 'EXPIRED'));
ALTER TABLE generation_tasks DROP CONSTRAINT ck_generation_tasks_review_state;
ALTER TABLE generation_tasks ADD CONSTRAINT ck_generation_tasks_review_state
    CHECK (review_state IN ('PENDING', 'CLAIMED', 'APPROVED', 'REJECTED', 'EXPIRED'));
