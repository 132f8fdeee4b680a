DROP TRIGGER resources_insert_change;
DROP TRIGGER resources_update_change;
CREATE TRIGGER resources_insert_change AFTER INSERT ON resources
BEGIN
    INSERT INTO change_pending (source, kind, id, version, deleted, state, origin, event_id)
    VALUES (NEW.source, NEW.kind, NEW.id, NEW.version, NEW.deleted, NEW.state, NEW.origin, NEW.last_event_id);
END;
CREATE TRIGGER resources_update_change AFTER UPDATE ON resources
WHEN NEW.state IS NOT OLD.state OR NEW.deleted IS NOT OLD.deleted
BEGIN
    INSERT INTO change_pending (source, kind, id, version, deleted, state, origin, event_id)
    VALUES (NEW.source, NEW.kind, NEW.id, NEW.version, NEW.deleted, NEW.state, NEW.origin, NEW.last_event_id);
END;
ALTER TABLE reconcile_state DROP COLUMN account;
ALTER TABLE reconcile_checkpoints DROP COLUMN account;
ALTER TABLE reconcile_leases DROP COLUMN account;
ALTER TABLE reconcile_runs DROP COLUMN account;
ALTER TABLE change_pending DROP COLUMN account;
ALTER TABLE changes DROP COLUMN account;
ALTER TABLE resources DROP COLUMN account;
