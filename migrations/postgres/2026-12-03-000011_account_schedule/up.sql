-- How the daemon reaches an account's API: its own base URL (a Shopify shop's), its own
-- credential (sealed with accounts.key; never stored in the clear). NULL: the source's.
ALTER TABLE accounts ADD COLUMN api_base TEXT;
ALTER TABLE accounts ADD COLUMN credential TEXT;

-- When each account-kind of a many-account source is next due, and how its last run
-- went. Replicas claim due rows (most overdue first, FOR UPDATE SKIP LOCKED), moving
-- due_at to the kind's next tick as they claim, so no two replicas start one
-- account-kind for the same tick; the run itself holds the fenced lease as always.
CREATE TABLE reconcile_due (
    source      TEXT        NOT NULL,
    account     TEXT        NOT NULL,
    kind        TEXT        NOT NULL,
    due_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at  TIMESTAMPTZ,
    finished_at TIMESTAMPTZ,
    status      TEXT        NOT NULL DEFAULT 'never'
                CHECK (status IN ('never', 'running', 'succeeded', 'failed', 'skipped')),
    error       TEXT,
    PRIMARY KEY (source, account, kind)
);
CREATE INDEX reconcile_due_next_idx ON reconcile_due (source, kind, due_at);
