-- PostgreSQL finds change_pending rows by transaction (see its migration); SQLite has
-- one writer at a time and removes deleted rows from the table's b-tree at once, so
-- it needs nothing. This file keeps both backends' migration lists the same.
SELECT 1;
