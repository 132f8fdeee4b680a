-- The views made from `[sources.S.kinds.K.columns]` (store::views): what `migrate` and
-- `serve` made, so that a view the configuration no longer declares is dropped, and a
-- table or view of someone else's is never replaced.
CREATE TABLE typed_views (
    name       TEXT        PRIMARY KEY,
    source     TEXT        NOT NULL,
    kind       TEXT        NOT NULL,
    -- The CREATE VIEW statement: a different one means the view is made again.
    definition TEXT        NOT NULL,
    -- Its indexes' names, one per line.
    indexes    TEXT        NOT NULL DEFAULT '',
    made_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- An RFC 3339 timestamp with its offset, or NULL for anything else: a view's column
-- never fails a query. IMMUTABLE (so it can be indexed) holds because the offset is
-- required: neither TimeZone nor DateStyle changes what such a text means.
CREATE FUNCTION webhook_reconciler_timestamptz(value TEXT) RETURNS TIMESTAMPTZ
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    IF value !~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?([Zz]|[+-][0-9]{2}:[0-9]{2})$' THEN
        RETURN NULL;
    END IF;
    RETURN value::timestamptz;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;
