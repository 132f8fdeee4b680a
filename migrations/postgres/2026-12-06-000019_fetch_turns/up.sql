-- Each account's next fetch, read from the index: a taker walks the accounts with
-- fetches pending and reads each one's first turn, instead of sorting every pending row
-- (store::sql::fetches::take_postgres).
CREATE INDEX pending_fetches_turn_idx ON pending_fetches (source, account, due_at, kind, id)
    WHERE failed_at IS NULL;
