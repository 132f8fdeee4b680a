DROP INDEX dead_letters_digest_idx;
ALTER TABLE dead_letters DROP COLUMN size;
ALTER TABLE dead_letters DROP COLUMN body_digest;
