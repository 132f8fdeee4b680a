DROP TABLE reconcile_state;
DROP TABLE reconcile_checkpoints;
DROP TABLE reconcile_leases;
DROP TABLE reconcile_runs;
