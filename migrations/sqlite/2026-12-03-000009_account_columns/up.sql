-- Same columns and meaning as migrations/postgres.
ALTER TABLE resources ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE changes ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE change_pending ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE reconcile_runs ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE reconcile_leases ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE reconcile_checkpoints ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE reconcile_state ADD COLUMN account TEXT NOT NULL DEFAULT '';

DROP TRIGGER resources_insert_change;
DROP TRIGGER resources_update_change;
CREATE TRIGGER resources_insert_change AFTER INSERT ON resources
BEGIN
    INSERT INTO change_pending (source, account, kind, id, version, deleted, state, origin, event_id)
    VALUES (NEW.source, NEW.account, NEW.kind, NEW.id, NEW.version, NEW.deleted, NEW.state, NEW.origin, NEW.last_event_id);
END;
CREATE TRIGGER resources_update_change AFTER UPDATE ON resources
WHEN NEW.state IS NOT OLD.state OR NEW.deleted IS NOT OLD.deleted
BEGIN
    INSERT INTO change_pending (source, account, kind, id, version, deleted, state, origin, event_id)
    VALUES (NEW.source, NEW.account, NEW.kind, NEW.id, NEW.version, NEW.deleted, NEW.state, NEW.origin, NEW.last_event_id);
END;
