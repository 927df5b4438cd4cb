-- A create (aivedio_engine/db/creation.py) is one statement sent in one pipeline with its BEGIN and COMMIT, so
-- the tenant's balance row is locked only for the server-side time of the commit, never across a round trip to
-- a busy API process. The statement therefore has to refuse an unaffordable reservation by itself: when the task
-- row was inserted but the balance did not cover its cost, it calls this function, whose error aborts the
-- transaction (the queued COMMIT then does nothing) and tells the caller "insufficient credits" by its SQLSTATE.

CREATE FUNCTION aivedio_insufficient_credits() RETURNS boolean
    LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RAISE EXCEPTION 'insufficient credits for this reservation' USING ERRCODE = 'AV402';
END
$$;
