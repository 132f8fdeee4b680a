-- The registry follows the platforms (SPEC "Tenants as the platforms run them"): why
-- and since when an account is disabled (an operator, an uninstall, a suspension), and
-- the uninstall that a shop's erasure may follow (`shop/redact` erases only a shop
-- uninstalled since its last registration).
ALTER TABLE accounts ADD COLUMN disabled_reason TEXT;
ALTER TABLE accounts ADD COLUMN disabled_at TIMESTAMPTZ;
ALTER TABLE accounts ADD COLUMN uninstalled_by TEXT;
-- An erasure's tombstones say they are one (`origin = 'erasure'`). Only widened, so the
-- rows already stored need no scan.
ALTER TABLE resources DROP CONSTRAINT resources_origin_check;
ALTER TABLE resources ADD CONSTRAINT resources_origin_check
    CHECK (origin IN ('webhook', 'reconcile', 'erasure')) NOT VALID;
