DROP TABLE reconcile_due;
ALTER TABLE accounts DROP COLUMN credential;
ALTER TABLE accounts DROP COLUMN api_base;
