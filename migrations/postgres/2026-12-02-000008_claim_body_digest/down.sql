DROP INDEX processed_events_body_digest_idx;
ALTER TABLE processed_events DROP COLUMN body_digest;
