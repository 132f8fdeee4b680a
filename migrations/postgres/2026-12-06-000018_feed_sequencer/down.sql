-- Number what is still pending first: the earlier code only moves its own rows.
WITH moved AS (DELETE FROM change_pending
     RETURNING pending_id, source, account, kind, id, version, deleted, state, origin, event_id, changed_at),
 counted AS (SELECT COUNT(*) AS n FROM moved),
 numbered AS (UPDATE change_seq SET last = last + counted.n FROM counted WHERE counted.n > 0 RETURNING last, counted.n AS n)
INSERT INTO changes (seq, source, account, kind, id, version, deleted, state, origin, event_id, changed_at)
SELECT numbered.last - numbered.n + ROW_NUMBER() OVER (ORDER BY m.pending_id),
       m.source, m.account, m.kind, m.id, m.version, m.deleted, m.state, m.origin, m.event_id, m.changed_at
FROM moved m CROSS JOIN numbered;
ALTER TABLE change_pending ADD COLUMN txid BIGINT NOT NULL DEFAULT txid_current();
CREATE INDEX change_pending_txid_idx ON change_pending (txid, pending_id);
ALTER TABLE change_pending DROP COLUMN changed_at;
ALTER TABLE change_pending SET UNLOGGED;
