-- Back to one account per source: rows of other accounts than '' cannot be kept.
DELETE FROM resources WHERE account <> '';
CREATE TABLE resources_old (
    source        TEXT    NOT NULL,
    kind          TEXT    NOT NULL,
    id            TEXT    NOT NULL,
    version       INTEGER NOT NULL CHECK (version >= 0),
    state         TEXT,
    deleted       BOOLEAN NOT NULL DEFAULT 0,
    origin        TEXT    NOT NULL CHECK (origin IN ('webhook', 'reconcile')),
    last_event_id TEXT,
    updated_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    state_digest  BIGINT,
    PRIMARY KEY (source, kind, id)
) WITHOUT ROWID;
INSERT INTO resources_old SELECT source, kind, id, version, state, deleted, origin, last_event_id, updated_at, state_digest FROM resources;
DROP TABLE resources;
ALTER TABLE resources_old RENAME TO resources;
CREATE TABLE reconcile_leases_old (source TEXT NOT NULL, kind TEXT NOT NULL, holder TEXT NOT NULL, expires_at TEXT NOT NULL, PRIMARY KEY (source, kind)) WITHOUT ROWID;
INSERT INTO reconcile_leases_old SELECT source, kind, holder, expires_at FROM reconcile_leases WHERE account = '';
DROP TABLE reconcile_leases;
ALTER TABLE reconcile_leases_old RENAME TO reconcile_leases;
CREATE TABLE reconcile_checkpoints_old (source TEXT NOT NULL, kind TEXT NOT NULL, position TEXT NOT NULL, sweep_started_at TEXT NOT NULL,
    updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')), PRIMARY KEY (source, kind)) WITHOUT ROWID;
INSERT INTO reconcile_checkpoints_old SELECT source, kind, position, sweep_started_at, updated_at FROM reconcile_checkpoints WHERE account = '';
DROP TABLE reconcile_checkpoints;
ALTER TABLE reconcile_checkpoints_old RENAME TO reconcile_checkpoints;
CREATE TABLE reconcile_state_old (source TEXT NOT NULL, kind TEXT NOT NULL, watermark INTEGER, last_full_at TEXT, PRIMARY KEY (source, kind)) WITHOUT ROWID;
INSERT INTO reconcile_state_old SELECT source, kind, watermark, last_full_at FROM reconcile_state WHERE account = '';
DROP TABLE reconcile_state;
ALTER TABLE reconcile_state_old RENAME TO reconcile_state;
DROP INDEX reconcile_runs_kind_idx;
CREATE INDEX reconcile_runs_kind_idx ON reconcile_runs (source, kind, started_at);
ALTER TABLE reconcile_runs DROP COLUMN account;
ALTER TABLE change_pending DROP COLUMN account;
ALTER TABLE changes DROP COLUMN account;
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
