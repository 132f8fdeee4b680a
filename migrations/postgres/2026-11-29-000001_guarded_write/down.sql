DROP TABLE dead_letters;
DROP TABLE resources;
DROP TABLE processed_events;
