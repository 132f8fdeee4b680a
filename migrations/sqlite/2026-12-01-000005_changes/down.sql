DROP TABLE consumer_skips;
DROP TABLE consumer_positions;
DROP TRIGGER resources_update_change;
DROP TRIGGER resources_insert_change;
DROP TABLE change_pending;
DROP TABLE change_seq;
DROP TABLE changes;
