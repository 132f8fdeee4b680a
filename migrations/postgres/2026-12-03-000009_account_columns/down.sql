CREATE OR REPLACE FUNCTION resources_record_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state OR NEW.deleted IS DISTINCT FROM OLD.deleted THEN
        INSERT INTO change_pending (source, kind, id, version, deleted, state, origin, event_id)
        VALUES (NEW.source, NEW.kind, NEW.id, NEW.version, NEW.deleted, NEW.state, NEW.origin, NEW.last_event_id);
    END IF;
    RETURN NULL;
END
$$;
ALTER TABLE reconcile_state DROP COLUMN account;
ALTER TABLE reconcile_checkpoints DROP COLUMN account;
ALTER TABLE reconcile_leases DROP COLUMN account;
ALTER TABLE reconcile_runs DROP COLUMN account;
ALTER TABLE change_pending DROP COLUMN account;
ALTER TABLE changes DROP COLUMN account;
ALTER TABLE resources DROP COLUMN account;
