-- Same columns and meaning as migrations/postgres (SQLite needs no function: its
-- strftime reads RFC 3339 and answers NULL for anything else).
CREATE TABLE typed_views (
    name       TEXT NOT NULL PRIMARY KEY,
    source     TEXT NOT NULL,
    kind       TEXT NOT NULL,
    definition TEXT NOT NULL,
    indexes    TEXT NOT NULL DEFAULT '',
    made_at    TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
