-- When each (source, account, kind) last succeeded, one row each, written in the
-- transaction that records the run's success. Freshness (`/metrics`, `/readyz`,
-- `status`, the systemd status line) reads this instead of grouping all of
-- `reconcile_runs`, a cost that grew with the runs kept (124 ms a call at 10,000
-- accounts after one run each; retention keeps weeks of them). It also outlives
-- retention: a kind whose runs were all pruned still knows when it last succeeded.
CREATE TABLE reconcile_last_success (
    source       TEXT COLLATE "C" NOT NULL,
    account      TEXT COLLATE "C" NOT NULL,
    kind         TEXT COLLATE "C" NOT NULL,
    succeeded_at TIMESTAMPTZ      NOT NULL,
    PRIMARY KEY (source, account, kind)
);
INSERT INTO reconcile_last_success (source, account, kind, succeeded_at)
SELECT source, account, kind, MAX(finished_at) FROM reconcile_runs
WHERE status = 'succeeded' AND finished_at IS NOT NULL
GROUP BY source, account, kind;
