ALTER TABLE processed_events
    ALTER COLUMN event_id TYPE TEXT COLLATE "default",
    ALTER COLUMN source TYPE TEXT COLLATE "default";
ALTER TABLE resources
    ALTER COLUMN id TYPE TEXT COLLATE "default",
    ALTER COLUMN kind TYPE TEXT COLLATE "default",
    ALTER COLUMN account TYPE TEXT COLLATE "default",
    ALTER COLUMN source TYPE TEXT COLLATE "default";
