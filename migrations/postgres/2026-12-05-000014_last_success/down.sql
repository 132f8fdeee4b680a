DROP TABLE reconcile_last_success;
