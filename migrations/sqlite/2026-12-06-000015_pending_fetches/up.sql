-- Same table and meaning as migrations/postgres (SQLite is one process: its writer lock
-- serialises takers, no SKIP LOCKED needed).
CREATE TABLE pending_fetches (
    source       TEXT    NOT NULL,
    account      TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    id           TEXT    NOT NULL,
    event_id     TEXT,
    reason       TEXT    NOT NULL CHECK (reason IN ('fetching', 'conflict')),
    requests     INTEGER NOT NULL DEFAULT 1,
    attempts     INTEGER NOT NULL DEFAULT 0,
    requested_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    due_at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    taken_by     TEXT,
    taken_until  TEXT,
    failed_at    TEXT,
    error        TEXT,
    PRIMARY KEY (source, account, kind, id)
) WITHOUT ROWID;
CREATE INDEX pending_fetches_due_idx ON pending_fetches (due_at) WHERE failed_at IS NULL;
-- The accounts with a fetch in flight (each account has at most one).
CREATE INDEX pending_fetches_taken_idx ON pending_fetches (taken_until) WHERE taken_until IS NOT NULL;

-- A claim may now record `fetching`. SQLite cannot change a CHECK in place: the table
-- is rebuilt (its rows copied once) with the same columns and indexes.
CREATE TABLE processed_events_new (
    source       TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    event_type   TEXT    NOT NULL,
    outcome      TEXT    NOT NULL CHECK (outcome IN ('applied', 'stale', 'conflict', 'ignored', 'fetching')),
    processed_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    body_digest  TEXT,
    account      TEXT    NOT NULL DEFAULT '',
    kind         TEXT,
    resource_id  TEXT,
    PRIMARY KEY (source, event_id)
) WITHOUT ROWID;
INSERT INTO processed_events_new (source, event_id, event_type, outcome, processed_at, body_digest, account, kind, resource_id)
SELECT source, event_id, event_type, outcome, processed_at, body_digest, account, kind, resource_id FROM processed_events;
DROP TABLE processed_events;
ALTER TABLE processed_events_new RENAME TO processed_events;
CREATE INDEX processed_events_processed_at_idx ON processed_events (processed_at);
CREATE UNIQUE INDEX processed_events_body_digest_idx ON processed_events (source, body_digest);
CREATE INDEX processed_events_resource_idx ON processed_events (source, account, kind, resource_id)
    WHERE resource_id IS NOT NULL;
