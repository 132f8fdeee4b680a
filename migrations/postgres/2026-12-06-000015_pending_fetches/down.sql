DROP TABLE pending_fetches;
UPDATE processed_events SET outcome = 'ignored' WHERE outcome = 'fetching';
ALTER TABLE processed_events DROP CONSTRAINT processed_events_outcome_check;
ALTER TABLE processed_events ADD CONSTRAINT processed_events_outcome_check
    CHECK (outcome IN ('applied', 'stale', 'conflict', 'ignored'));
