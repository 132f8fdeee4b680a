-- Senders that sign only the body (github, shopify) do not sign the delivery id header:
-- a captured body replayed with fresh ids must still be a duplicate. Their claims also
-- carry the SHA-256 of the signed body, unique per source; the claim's
-- ON CONFLICT DO NOTHING then covers both keys. NULL for every other scheme.
ALTER TABLE processed_events ADD COLUMN body_digest TEXT;
CREATE UNIQUE INDEX processed_events_body_digest_idx ON processed_events (source, body_digest);
