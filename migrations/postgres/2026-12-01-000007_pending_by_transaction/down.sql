DROP INDEX change_pending_txid_idx;
ALTER TABLE change_pending DROP COLUMN txid;
