-- Same tables and meaning as migrations/postgres.
CREATE TABLE reconcile_runs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    source        TEXT    NOT NULL,
    kind          TEXT    NOT NULL,
    mode          TEXT    NOT NULL CHECK (mode IN ('full', 'incremental')),
    status        TEXT    NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'abandoned')),
    started_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    finished_at   TEXT,
    pages         INTEGER NOT NULL DEFAULT 0,
    scanned       INTEGER NOT NULL DEFAULT 0,
    missing       INTEGER NOT NULL DEFAULT 0,
    newer_remote  INTEGER NOT NULL DEFAULT 0,
    differing     INTEGER NOT NULL DEFAULT 0,
    newer_local   INTEGER NOT NULL DEFAULT 0,
    equal         INTEGER NOT NULL DEFAULT 0,
    applied       INTEGER NOT NULL DEFAULT 0,
    tombstoned    INTEGER NOT NULL DEFAULT 0,
    error         TEXT
);
CREATE INDEX reconcile_runs_kind_idx ON reconcile_runs (source, kind, started_at);
CREATE INDEX reconcile_runs_started_at_idx ON reconcile_runs (started_at);

CREATE TABLE reconcile_leases (
    source     TEXT NOT NULL,
    kind       TEXT NOT NULL,
    holder     TEXT NOT NULL,
    expires_at TEXT NOT NULL,
    PRIMARY KEY (source, kind)
) WITHOUT ROWID;

CREATE TABLE reconcile_checkpoints (
    source     TEXT NOT NULL,
    kind       TEXT NOT NULL,
    position   TEXT NOT NULL,
    sweep_started_at TEXT NOT NULL,
    updated_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (source, kind)
) WITHOUT ROWID;

CREATE TABLE reconcile_state (
    source       TEXT    NOT NULL,
    kind         TEXT    NOT NULL,
    watermark    INTEGER,
    last_full_at TEXT,
    PRIMARY KEY (source, kind)
) WITHOUT ROWID;
