-- Same columns and meaning as migrations/postgres. `resources.origin` keeps its CHECK
-- here (SQLite cannot widen one in place, and rebuilding the table would drop the
-- typed views' indexes): an erasure deletes the rows it tombstones in the same
-- transaction, and labels their changes `erasure` in `change_pending` (store::sql).
ALTER TABLE accounts ADD COLUMN disabled_reason TEXT;
ALTER TABLE accounts ADD COLUMN disabled_at TEXT;
ALTER TABLE accounts ADD COLUMN uninstalled_by TEXT;
