DROP TABLE prune_runs;
