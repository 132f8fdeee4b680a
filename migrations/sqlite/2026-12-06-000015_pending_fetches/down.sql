DROP TABLE pending_fetches;
UPDATE processed_events SET outcome = 'ignored' WHERE outcome = 'fetching';
