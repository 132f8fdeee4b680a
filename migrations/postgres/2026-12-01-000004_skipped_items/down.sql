ALTER TABLE reconcile_runs DROP COLUMN skipped;
