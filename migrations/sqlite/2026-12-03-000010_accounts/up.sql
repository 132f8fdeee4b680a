-- Same table and meaning as migrations/postgres.
CREATE TABLE accounts (
    source     TEXT    NOT NULL,
    account    TEXT    NOT NULL CHECK (account <> ''),
    enabled    BOOLEAN NOT NULL DEFAULT 1,
    created_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (source, account)
) WITHOUT ROWID;
