-- Same tables and meaning as migrations/postgres; SQLite types: timestamps are
-- ISO 8601 UTC text (sortable), booleans 0/1, state is canonical JSON text.
CREATE TABLE processed_events (
    source       TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    event_type   TEXT    NOT NULL,
    outcome      TEXT    NOT NULL CHECK (outcome IN ('applied', 'stale', 'conflict', 'ignored')),
    processed_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (source, event_id)
) WITHOUT ROWID;
CREATE INDEX processed_events_processed_at_idx ON processed_events (processed_at);

CREATE TABLE resources (
    source        TEXT    NOT NULL,
    kind          TEXT    NOT NULL,
    id            TEXT    NOT NULL,
    version       INTEGER NOT NULL CHECK (version >= 0),
    state         TEXT,
    deleted       BOOLEAN NOT NULL DEFAULT 0,
    origin        TEXT    NOT NULL CHECK (origin IN ('webhook', 'reconcile')),
    last_event_id TEXT,
    updated_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (source, kind, id)
) WITHOUT ROWID;

CREATE TABLE dead_letters (
    source        TEXT    NOT NULL,
    event_id      TEXT    NOT NULL,
    event_type    TEXT    NOT NULL,
    reason        TEXT    NOT NULL,
    body          TEXT    NOT NULL,
    attempts      INTEGER NOT NULL DEFAULT 1,
    first_seen_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    last_seen_at  TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (source, event_id)
) WITHOUT ROWID;
CREATE INDEX dead_letters_last_seen_at_idx ON dead_letters (last_seen_at);
