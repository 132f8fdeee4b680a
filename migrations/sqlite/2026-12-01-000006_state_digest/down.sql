ALTER TABLE resources DROP COLUMN state_digest;
