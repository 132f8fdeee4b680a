-- A digest of each row's state (the first 8 bytes of SHA-256 over the canonical JSON
-- text the guarded write stores), written by that write: reconcile compares a page
-- with the local rows by digest instead of reading every state back. Rows written
-- before this column existed have none; the compare reads their state instead.
ALTER TABLE resources ADD COLUMN state_digest BIGINT;
