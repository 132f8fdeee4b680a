-- One row per retention pass (prune), for `status` and the operators.
CREATE TABLE prune_runs (
    id               BIGSERIAL   PRIMARY KEY,
    started_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at      TIMESTAMPTZ,
    processed_events BIGINT      NOT NULL DEFAULT 0,
    reconcile_runs   BIGINT      NOT NULL DEFAULT 0,
    dead_letters     BIGINT      NOT NULL DEFAULT 0,
    error            TEXT
);
CREATE INDEX prune_runs_started_at_idx ON prune_runs (started_at);
