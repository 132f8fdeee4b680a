-- Dead letters bounded: a body kept once per sender-signed digest (a captured body
-- replayed under fresh delivery ids adds attempts, not rows), and each row's size, so a
-- source's total is one sum and listing reads no bodies.
ALTER TABLE dead_letters ADD COLUMN body_digest TEXT;
ALTER TABLE dead_letters ADD COLUMN size INTEGER NOT NULL DEFAULT 0;
UPDATE dead_letters SET size = length(CAST(body AS BLOB));
CREATE UNIQUE INDEX dead_letters_digest_idx ON dead_letters (source, body_digest)
    WHERE body_digest IS NOT NULL;
