ALTER TABLE accounts DROP COLUMN uninstalled_by;
ALTER TABLE accounts DROP COLUMN disabled_at;
ALTER TABLE accounts DROP COLUMN disabled_reason;
