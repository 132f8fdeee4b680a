-- Keys compare byte by byte ("C"), whatever the database's default collation: the
-- primary-key probes of every delivery and every sweep page compare text keys, and a
-- locale's collation (en_US.UTF-8, even C.UTF-8 on PostgreSQL 15) goes through strcoll
-- for each comparison. Byte order is also the order Rust sorts these keys in.
-- Only the indexes on these columns are rebuilt (the rows stay where they are); on a
-- large table that takes a while, once.
ALTER TABLE resources
    ALTER COLUMN source TYPE TEXT COLLATE "C",
    ALTER COLUMN account TYPE TEXT COLLATE "C",
    ALTER COLUMN kind TYPE TEXT COLLATE "C",
    ALTER COLUMN id TYPE TEXT COLLATE "C";
ALTER TABLE processed_events
    ALTER COLUMN source TYPE TEXT COLLATE "C",
    ALTER COLUMN event_id TYPE TEXT COLLATE "C";
