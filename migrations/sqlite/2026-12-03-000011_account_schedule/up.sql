-- Same columns, table and meaning as migrations/postgres (SQLite is one process: no
-- SKIP LOCKED needed, its writer lock serialises claims).
ALTER TABLE accounts ADD COLUMN api_base TEXT;
ALTER TABLE accounts ADD COLUMN credential TEXT;

CREATE TABLE reconcile_due (
    source      TEXT NOT NULL,
    account     TEXT NOT NULL,
    kind        TEXT NOT NULL,
    due_at      TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    started_at  TEXT,
    finished_at TEXT,
    status      TEXT NOT NULL DEFAULT 'never'
                CHECK (status IN ('never', 'running', 'succeeded', 'failed', 'skipped')),
    error       TEXT,
    PRIMARY KEY (source, account, kind)
) WITHOUT ROWID;
CREATE INDEX reconcile_due_next_idx ON reconcile_due (source, kind, due_at);
