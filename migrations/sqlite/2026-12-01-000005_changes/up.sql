-- Same tables and meaning as migrations/postgres. SQLite has one writer at a time, so
-- seqs handed out at the end of a transaction are in commit order by construction.
CREATE TABLE changes (
    seq        INTEGER PRIMARY KEY,
    source     TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    id         TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    deleted    BOOLEAN NOT NULL,
    state      TEXT,
    origin     TEXT    NOT NULL,
    event_id   TEXT,
    changed_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
CREATE INDEX changes_changed_at_idx ON changes (changed_at);

CREATE TABLE change_seq (
    one  BOOLEAN PRIMARY KEY DEFAULT 1 CHECK (one = 1),
    last INTEGER NOT NULL
);
INSERT INTO change_seq (one, last) VALUES (1, 0);

CREATE TABLE change_pending (
    pending_id INTEGER PRIMARY KEY,
    source     TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    id         TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    deleted    BOOLEAN NOT NULL,
    state      TEXT,
    origin     TEXT    NOT NULL,
    event_id   TEXT
);

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

CREATE TABLE consumer_positions (
    consumer   TEXT    PRIMARY KEY,
    position   INTEGER NOT NULL DEFAULT 0,
    updated_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);

CREATE TABLE consumer_skips (
    consumer   TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    attempts   INTEGER NOT NULL,
    last_error TEXT    NOT NULL,
    skipped_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (consumer, seq)
);
