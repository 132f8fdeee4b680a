-- The change feed's seqs are handed out after the writing transaction commits, by the
-- sequencer (feed::outbox), instead of under the lock of `change_seq` held through
-- every writer's commit: that lock made the commits of every replica wait on each
-- other. A pending change now outlives its transaction until a pass numbers it, so the
-- table is logged (a crash keeps it) and carries its write's time. Passes take every
-- committed row, so the index by transaction goes.
ALTER TABLE change_pending SET LOGGED;
ALTER TABLE change_pending ADD COLUMN changed_at TIMESTAMPTZ NOT NULL DEFAULT now();
DROP INDEX change_pending_txid_idx;
ALTER TABLE change_pending DROP COLUMN txid;
