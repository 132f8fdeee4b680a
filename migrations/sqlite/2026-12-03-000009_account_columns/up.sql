-- Same columns, keys and meaning as migrations/postgres. SQLite cannot change a
-- primary key in place: the four tables keyed by it are rebuilt (the triggers on
-- `resources` go with the old table and are made again).
CREATE TABLE resources_new (
    source        TEXT    NOT NULL,
    account       TEXT    NOT NULL DEFAULT '',
    kind          TEXT    NOT NULL,
    id            TEXT    NOT NULL,
    version       INTEGER NOT NULL CHECK (version >= 0),
    state         TEXT,
    deleted       BOOLEAN NOT NULL DEFAULT 0,
    origin        TEXT    NOT NULL CHECK (origin IN ('webhook', 'reconcile')),
    last_event_id TEXT,
    updated_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    state_digest  BIGINT,
    PRIMARY KEY (source, account, kind, id)
) WITHOUT ROWID;
INSERT INTO resources_new (source, account, kind, id, version, state, deleted, origin, last_event_id, updated_at, state_digest)
    SELECT source, '', kind, id, version, state, deleted, origin, last_event_id, updated_at, state_digest FROM resources;
DROP TABLE resources;
ALTER TABLE resources_new RENAME TO resources;

CREATE TABLE reconcile_leases_new (
    source     TEXT NOT NULL,
    account    TEXT NOT NULL DEFAULT '',
    kind       TEXT NOT NULL,
    holder     TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    PRIMARY KEY (source, account, kind)
) WITHOUT ROWID;
INSERT INTO reconcile_leases_new (source, account, kind, holder, expires_at)
    SELECT source, '', kind, holder, expires_at FROM reconcile_leases;
DROP TABLE reconcile_leases;
ALTER TABLE reconcile_leases_new RENAME TO reconcile_leases;

CREATE TABLE reconcile_checkpoints_new (
    source     TEXT NOT NULL,
    account    TEXT NOT NULL DEFAULT '',
    kind       TEXT NOT NULL,
    position   TEXT NOT NULL,
    sweep_started_at TEXT NOT NULL,
    updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (source, account, kind)
) WITHOUT ROWID;
INSERT INTO reconcile_checkpoints_new (source, account, kind, position, sweep_started_at, updated_at)
    SELECT source, '', kind, position, sweep_started_at, updated_at FROM reconcile_checkpoints;
DROP TABLE reconcile_checkpoints;
ALTER TABLE reconcile_checkpoints_new RENAME TO reconcile_checkpoints;

CREATE TABLE reconcile_state_new (
    source       TEXT    NOT NULL,
    account      TEXT    NOT NULL DEFAULT '',
    kind         TEXT    NOT NULL,
    watermark    INTEGER,
    last_full_at TEXT,
    PRIMARY KEY (source, account, kind)
) WITHOUT ROWID;
INSERT INTO reconcile_state_new (source, account, kind, watermark, last_full_at)
    SELECT source, '', kind, watermark, last_full_at FROM reconcile_state;
DROP TABLE reconcile_state;
ALTER TABLE reconcile_state_new RENAME TO reconcile_state;

ALTER TABLE changes ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE change_pending ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE reconcile_runs ADD COLUMN account TEXT NOT NULL DEFAULT '';
DROP INDEX reconcile_runs_kind_idx;
CREATE INDEX reconcile_runs_kind_idx ON reconcile_runs (source, account, kind, started_at);

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
