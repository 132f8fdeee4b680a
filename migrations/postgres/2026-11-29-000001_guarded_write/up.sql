-- One row per handled event. The primary key IS the idempotency mechanism: the claim
-- and the resource write commit together, so a concurrent duplicate blocks on this key
-- and then finds the claim taken.
CREATE TABLE processed_events (
    source       TEXT        NOT NULL,
    event_id     TEXT        NOT NULL,
    event_type   TEXT        NOT NULL,
    outcome      TEXT        NOT NULL CHECK (outcome IN ('applied', 'stale', 'conflict', 'ignored')),
    processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, event_id)
);
-- Retention deletes oldest-first in bounded batches through this index.
CREATE INDEX processed_events_processed_at_idx ON processed_events (processed_at);

-- The current state of every resource a sender owns, one row each.
CREATE TABLE resources (
    source        TEXT        NOT NULL,
    kind          TEXT        NOT NULL,
    id            TEXT        NOT NULL,
    -- Integer versions as sent; timestamps as microseconds since the Unix epoch;
    -- 0 for insert-once kinds.
    version       BIGINT      NOT NULL CHECK (version >= 0),
    -- NULL only for a tombstone of a resource whose state we never saw.
    state         JSONB,
    deleted       BOOLEAN     NOT NULL DEFAULT false,
    origin        TEXT        NOT NULL CHECK (origin IN ('webhook', 'reconcile')),
    last_event_id TEXT,
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, kind, id)
);

-- Authentic deliveries we could not read (a mapped pointer missing or of the wrong
-- type). Not claimed: once the mapping is fixed, the sender's retry is applied.
CREATE TABLE dead_letters (
    source        TEXT        NOT NULL,
    event_id      TEXT        NOT NULL,
    event_type    TEXT        NOT NULL,
    reason        TEXT        NOT NULL,
    body          TEXT        NOT NULL,
    attempts      INTEGER     NOT NULL DEFAULT 1,
    first_seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, event_id)
);
CREATE INDEX dead_letters_last_seen_at_idx ON dead_letters (last_seen_at);
