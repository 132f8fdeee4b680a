-- One row per (source, kind) per reconcile run: written at start, finished at the end.
-- A run that gave up is 'failed', never 'succeeded'; one whose process died stays
-- 'running' until the next run of that kind marks it 'abandoned'.
CREATE TABLE reconcile_runs (
    id            BIGSERIAL   PRIMARY KEY,
    source        TEXT        NOT NULL,
    kind          TEXT        NOT NULL,
    mode          TEXT        NOT NULL CHECK (mode IN ('full', 'incremental')),
    status        TEXT        NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'abandoned')),
    started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at   TIMESTAMPTZ,
    pages         BIGINT      NOT NULL DEFAULT 0,
    scanned       BIGINT      NOT NULL DEFAULT 0,
    missing       BIGINT      NOT NULL DEFAULT 0,
    newer_remote  BIGINT      NOT NULL DEFAULT 0,
    differing     BIGINT      NOT NULL DEFAULT 0,
    newer_local   BIGINT      NOT NULL DEFAULT 0,
    equal         BIGINT      NOT NULL DEFAULT 0,
    applied       BIGINT      NOT NULL DEFAULT 0,
    tombstoned    BIGINT      NOT NULL DEFAULT 0,
    error         TEXT
);
CREATE INDEX reconcile_runs_kind_idx ON reconcile_runs (source, kind, started_at);
CREATE INDEX reconcile_runs_started_at_idx ON reconcile_runs (started_at);

-- Who may reconcile a (source, kind) now. A holder renews before expiry; a crashed
-- holder's lease simply expires.
CREATE TABLE reconcile_leases (
    source     TEXT        NOT NULL,
    kind       TEXT        NOT NULL,
    holder     TEXT        NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (source, kind)
);

-- Where an unfinished full sweep stopped, so the next run resumes there while the
-- sender's cursor is still good.
CREATE TABLE reconcile_checkpoints (
    source     TEXT        NOT NULL,
    kind       TEXT        NOT NULL,
    position   TEXT        NOT NULL,
    sweep_started_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (source, kind)
);

-- Incremental listing: the highest last-modified time seen (microseconds since the
-- epoch, the sender's clock) and when the last complete full sweep began.
CREATE TABLE reconcile_state (
    source       TEXT        NOT NULL,
    kind         TEXT        NOT NULL,
    watermark    BIGINT,
    last_full_at TIMESTAMPTZ,
    PRIMARY KEY (source, kind)
);
