-- change_pending rows are found by their transaction, through an index: a publish
-- never scans the dead rows that earlier transactions left until vacuum (on a busy
-- table, thousands: a sequential scan of them cost ~10 ms per reconcile page).
ALTER TABLE change_pending ADD COLUMN txid BIGINT NOT NULL DEFAULT txid_current();
CREATE INDEX change_pending_txid_idx ON change_pending (txid, pending_id);
