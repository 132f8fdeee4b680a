DROP TABLE reconcile_paused;
ALTER TABLE consumer_positions DROP COLUMN paused;
ALTER TABLE dead_letters DROP COLUMN account_hint;
DROP INDEX changes_resource_idx;
DROP INDEX processed_events_resource_idx;
ALTER TABLE processed_events DROP COLUMN resource_id;
ALTER TABLE processed_events DROP COLUMN kind;
ALTER TABLE processed_events DROP COLUMN account;
