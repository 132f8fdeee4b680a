-- A 200 promises what follows it. A delivery answered `fetching` (the sender signs no
-- account: Shopify) and a conflict settled through `get` are recorded here in the
-- claim's own transaction, keyed by the resource: two deliveries for one resource are
-- one fetch. Any process of any replica takes due rows (FOR UPDATE SKIP LOCKED, one
-- in flight per account, accounts in turn), applies what it fetched through the
-- guarded write and deletes the row in that write's transaction. `requests` counts
-- the deliveries that asked: a fetch deletes the row only if no request came while it
-- ran (the running one may predate it). `taken_until` is how long a taker may hold a
-- row without finishing; `failed_at` is set after the last attempt.
CREATE TABLE pending_fetches (
    source       TEXT COLLATE "C" NOT NULL,
    account      TEXT COLLATE "C" NOT NULL,
    kind         TEXT COLLATE "C" NOT NULL,
    id           TEXT COLLATE "C" NOT NULL,
    event_id     TEXT,
    reason       TEXT        NOT NULL CHECK (reason IN ('fetching', 'conflict')),
    requests     BIGINT      NOT NULL DEFAULT 1,
    attempts     INTEGER     NOT NULL DEFAULT 0,
    requested_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    due_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    taken_by     TEXT,
    taken_until  TIMESTAMPTZ,
    failed_at    TIMESTAMPTZ,
    error        TEXT,
    PRIMARY KEY (source, account, kind, id)
);
CREATE INDEX pending_fetches_due_idx ON pending_fetches (due_at) WHERE failed_at IS NULL;
-- The accounts with a fetch in flight (each account has at most one).
CREATE INDEX pending_fetches_taken_idx ON pending_fetches (taken_until) WHERE taken_until IS NOT NULL;

-- A claim may now record `fetching` (before, such a claim was stored as `ignored`,
-- without its resource). The wider check holds for every existing row: NOT VALID then
-- VALIDATE keeps writes going while the table is checked.
ALTER TABLE processed_events DROP CONSTRAINT processed_events_outcome_check;
ALTER TABLE processed_events ADD CONSTRAINT processed_events_outcome_check
    CHECK (outcome IN ('applied', 'stale', 'conflict', 'ignored', 'fetching')) NOT VALID;
ALTER TABLE processed_events VALIDATE CONSTRAINT processed_events_outcome_check;
