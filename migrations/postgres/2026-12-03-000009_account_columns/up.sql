-- Many accounts per sender: every table keyed by (source, kind) or holding a resource's
-- key gets an `account` column, '' for a single-account source, so an existing
-- database migrates in place, and the keys include it: the same resource id in two
-- accounts is two rows, and each account's kinds have their own lease, checkpoint and
-- watermark. The change feed carries it from the resource row to its change.
ALTER TABLE resources ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE changes ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE change_pending ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE reconcile_runs ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE reconcile_leases ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE reconcile_checkpoints ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE reconcile_state ADD COLUMN account TEXT NOT NULL DEFAULT '';

ALTER TABLE resources DROP CONSTRAINT resources_pkey, ADD PRIMARY KEY (source, account, kind, id);
ALTER TABLE reconcile_leases DROP CONSTRAINT reconcile_leases_pkey, ADD PRIMARY KEY (source, account, kind);
ALTER TABLE reconcile_checkpoints DROP CONSTRAINT reconcile_checkpoints_pkey, ADD PRIMARY KEY (source, account, kind);
ALTER TABLE reconcile_state DROP CONSTRAINT reconcile_state_pkey, ADD PRIMARY KEY (source, account, kind);
DROP INDEX reconcile_runs_kind_idx;
CREATE INDEX reconcile_runs_kind_idx ON reconcile_runs (source, account, kind, started_at);

CREATE OR REPLACE FUNCTION resources_record_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state OR NEW.deleted IS DISTINCT FROM OLD.deleted THEN
        INSERT INTO change_pending (source, account, kind, id, version, deleted, state, origin, event_id)
        VALUES (NEW.source, NEW.account, NEW.kind, NEW.id, NEW.version, NEW.deleted, NEW.state, NEW.origin, NEW.last_event_id);
    END IF;
    RETURN NULL;
END
$$;
