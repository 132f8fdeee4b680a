-- The sequencer's pass (feed::outbox) as one call: it was four round trips (BEGIN, the
-- lock of `change_seq`, the move, COMMIT), and every pass took the lock, which writes
-- WAL, so a pass that found nothing still waited for a flush. Now a pass that finds
-- nothing pending returns without a lock or a write, and one that finds something is
-- one statement sent in autocommit (benches/feed_writers.sh).
--
-- Why it is correct: the lock serialises passes and is held to commit; each statement
-- of a VOLATILE function in READ COMMITTED takes a fresh snapshot, so the move, which
-- runs after the lock is held, sees every change committed before this pass held it,
-- and a pass that holds it later gets higher seqs and commits later. Under REPEATABLE
-- READ or SERIALIZABLE the move would see the caller's older snapshot, so the function
-- refuses to run there.
CREATE FUNCTION feed_sequence_pass(batch BIGINT) RETURNS BIGINT LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    moved_n BIGINT;
    total BIGINT := 0;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'feed_sequence_pass needs READ COMMITTED, not %', current_setting('transaction_isolation')
            USING HINT = 'set default_transaction_isolation to ''read committed'' for the daemon''s database user';
    END IF;
    -- Through the primary key, lowest first: index entries of rows earlier passes
    -- deleted are marked dead once seen, where a sequential scan would read every dead
    -- row until a vacuum reaches them.
    PERFORM 1 FROM change_pending ORDER BY pending_id LIMIT 1;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    PERFORM last FROM change_seq FOR UPDATE;
    -- At most `batch` at a time, lowest pending_id first (one resource's changes stay in
    -- order: its later write waited for the earlier one's commit, so has the higher id).
    LOOP
        moved_n := NULL;
        WITH moved AS (
            DELETE FROM change_pending
            WHERE pending_id = ANY (ARRAY(SELECT pending_id FROM change_pending ORDER BY pending_id LIMIT batch))
            RETURNING pending_id, source, account, kind, id, version, deleted, state, origin, event_id, changed_at),
        counted AS (SELECT COUNT(*) AS n FROM moved),
        numbered AS (
            UPDATE change_seq SET last = last + counted.n FROM counted
            WHERE counted.n > 0 RETURNING last, counted.n AS n),
        inserted AS (
            INSERT INTO changes (seq, source, account, kind, id, version, deleted, state, origin, event_id, changed_at)
            SELECT numbered.last - numbered.n + ROW_NUMBER() OVER (ORDER BY m.pending_id),
                   m.source, m.account, m.kind, m.id, m.version, m.deleted, m.state, m.origin, m.event_id, m.changed_at
            FROM moved m CROSS JOIN numbered)
        SELECT numbered.n FROM numbered INTO moved_n;
        total := total + COALESCE(moved_n, 0);
        EXIT WHEN COALESCE(moved_n, 0) < batch;
    END LOOP;
    RETURN total;
END
$$;
