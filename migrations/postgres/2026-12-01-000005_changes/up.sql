-- The change feed: one row per write that changed a resource's state or deletion
-- flag, appended in the same transaction as the write.
--
-- Visibility order: `seq` is handed out at the END of the writing transaction, under
-- the row lock of `change_seq`, which is held until that transaction commits. A
-- transaction that takes the lock later gets higher numbers and commits later, so a
-- reader that has seen seq = n never later finds a new row with seq <= n. The lock is
-- the last one a writing transaction takes, so it cannot be part of a deadlock.
CREATE TABLE changes (
    seq        BIGINT      PRIMARY KEY,
    source     TEXT        NOT NULL,
    kind       TEXT        NOT NULL,
    id         TEXT        NOT NULL,
    version    BIGINT      NOT NULL,
    deleted    BOOLEAN     NOT NULL,
    state      JSONB,
    origin     TEXT        NOT NULL,
    event_id   TEXT,
    changed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX changes_changed_at_idx ON changes (changed_at);

CREATE TABLE change_seq (
    one  BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
    last BIGINT  NOT NULL
);
INSERT INTO change_seq (one, last) VALUES (true, 0);

-- Changes of the running transaction before they get their seq. Rows never outlive
-- their transaction (they are moved to `changes` before it commits), so the table
-- needs no WAL.
CREATE UNLOGGED TABLE change_pending (
    pending_id BIGSERIAL PRIMARY KEY,
    source     TEXT      NOT NULL,
    kind       TEXT      NOT NULL,
    id         TEXT      NOT NULL,
    version    BIGINT    NOT NULL,
    deleted    BOOLEAN   NOT NULL,
    state      JSONB,
    origin     TEXT      NOT NULL,
    event_id   TEXT
);

-- Every write that changes state or the deletion flag, whatever path made it.
CREATE FUNCTION resources_record_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state OR NEW.deleted IS DISTINCT FROM OLD.deleted THEN
        INSERT INTO change_pending (source, kind, id, version, deleted, state, origin, event_id)
        VALUES (NEW.source, NEW.kind, NEW.id, NEW.version, NEW.deleted, NEW.state, NEW.origin, NEW.last_event_id);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER resources_record_change AFTER INSERT OR UPDATE ON resources
    FOR EACH ROW EXECUTE FUNCTION resources_record_change();

-- Where each consumer is: every change with seq <= position was answered 2xx.
CREATE TABLE consumer_positions (
    consumer   TEXT        PRIMARY KEY,
    position   BIGINT      NOT NULL DEFAULT 0,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Changes a consumer with on_failure = "skip" gave up on.
CREATE TABLE consumer_skips (
    consumer   TEXT        NOT NULL,
    seq        BIGINT      NOT NULL,
    attempts   INTEGER     NOT NULL,
    last_error TEXT        NOT NULL,
    skipped_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, seq)
);
