-- Items of a listing that could not be read or stored were skipped and reported;
-- the run ends failed with their count.
ALTER TABLE reconcile_runs ADD COLUMN skipped BIGINT NOT NULL DEFAULT 0;
