-- Same table and meaning as migrations/postgres.
CREATE TABLE reconcile_last_success (
    source       TEXT NOT NULL,
    account      TEXT NOT NULL,
    kind         TEXT NOT NULL,
    succeeded_at TEXT NOT NULL,
    PRIMARY KEY (source, account, kind)
) WITHOUT ROWID;
INSERT INTO reconcile_last_success (source, account, kind, succeeded_at)
SELECT source, account, kind, MAX(finished_at) FROM reconcile_runs
WHERE status = 'succeeded' AND finished_at IS NOT NULL
GROUP BY source, account, kind;
