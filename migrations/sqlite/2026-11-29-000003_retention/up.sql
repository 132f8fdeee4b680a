CREATE TABLE prune_runs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at       TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    finished_at      TEXT,
    processed_events INTEGER NOT NULL DEFAULT 0,
    reconcile_runs   INTEGER NOT NULL DEFAULT 0,
    dead_letters     INTEGER NOT NULL DEFAULT 0,
    error            TEXT
);
CREATE INDEX prune_runs_started_at_idx ON prune_runs (started_at);
