-- Back to one account per source: only rows of account '' can be kept.
DELETE FROM resources WHERE account <> '';
DELETE FROM reconcile_leases WHERE account <> '';
DELETE FROM reconcile_checkpoints WHERE account <> '';
DELETE FROM reconcile_state WHERE account <> '';
CREATE OR REPLACE FUNCTION resources_record_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state OR NEW.deleted IS DISTINCT FROM OLD.deleted THEN
        INSERT INTO change_pending (source, kind, id, version, deleted, state, origin, event_id)
        VALUES (NEW.source, NEW.kind, NEW.id, NEW.version, NEW.deleted, NEW.state, NEW.origin, NEW.last_event_id);
    END IF;
    RETURN NULL;
END
$$;
DROP INDEX reconcile_runs_kind_idx;
CREATE INDEX reconcile_runs_kind_idx ON reconcile_runs (source, kind, started_at);
ALTER TABLE reconcile_state DROP CONSTRAINT reconcile_state_pkey, ADD PRIMARY KEY (source, kind);
ALTER TABLE reconcile_checkpoints DROP CONSTRAINT reconcile_checkpoints_pkey, ADD PRIMARY KEY (source, kind);
ALTER TABLE reconcile_leases DROP CONSTRAINT reconcile_leases_pkey, ADD PRIMARY KEY (source, kind);
ALTER TABLE resources DROP CONSTRAINT resources_pkey, ADD PRIMARY KEY (source, kind, id);
ALTER TABLE reconcile_state DROP COLUMN account;
ALTER TABLE reconcile_checkpoints DROP COLUMN account;
ALTER TABLE reconcile_leases DROP COLUMN account;
ALTER TABLE reconcile_runs DROP COLUMN account;
ALTER TABLE change_pending DROP COLUMN account;
ALTER TABLE changes DROP COLUMN account;
ALTER TABLE resources DROP COLUMN account;
