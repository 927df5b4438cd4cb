-- slot_grants was never written: the slot store is Redis or in-process, never PostgreSQL, and each grant is
-- already recorded where it is used, as the fencing_token the dispatcher writes into the attempt it creates (and
-- the slot reconciler raises while that attempt is in flight). The audit's fence check (I7.2) and the fence floor
-- read task_attempts; a table nobody fills only let that check pass whatever happened.
DROP TABLE slot_grants;
