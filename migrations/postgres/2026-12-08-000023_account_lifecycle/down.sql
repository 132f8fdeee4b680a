ALTER TABLE resources DROP CONSTRAINT resources_origin_check;
ALTER TABLE resources ADD CONSTRAINT resources_origin_check
    CHECK (origin IN ('webhook', 'reconcile')) NOT VALID;
ALTER TABLE accounts DROP COLUMN uninstalled_by;
ALTER TABLE accounts DROP COLUMN disabled_at;
ALTER TABLE accounts DROP COLUMN disabled_reason;
