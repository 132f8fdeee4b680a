CREATE INDEX changes_changed_at_idx ON changes (changed_at);
