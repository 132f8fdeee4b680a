DROP TABLE consumer_skips;
DROP TABLE consumer_positions;
DROP TRIGGER resources_record_change ON resources;
DROP FUNCTION resources_record_change();
DROP TABLE change_pending;
DROP TABLE change_seq;
DROP TABLE changes;
