-- Same columns, indexes, table and meaning as migrations/postgres.
ALTER TABLE processed_events ADD COLUMN account TEXT NOT NULL DEFAULT '';
ALTER TABLE processed_events ADD COLUMN kind TEXT;
ALTER TABLE processed_events ADD COLUMN resource_id TEXT;
CREATE INDEX processed_events_resource_idx ON processed_events (source, account, kind, resource_id)
    WHERE resource_id IS NOT NULL;
CREATE INDEX changes_resource_idx ON changes (source, account, kind, id);
ALTER TABLE dead_letters ADD COLUMN account_hint TEXT;
ALTER TABLE consumer_positions ADD COLUMN paused BOOLEAN NOT NULL DEFAULT 0;
CREATE TABLE reconcile_paused (
    source    TEXT NOT NULL,
    kind      TEXT NOT NULL,
    paused_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (source, kind)
) WITHOUT ROWID;
