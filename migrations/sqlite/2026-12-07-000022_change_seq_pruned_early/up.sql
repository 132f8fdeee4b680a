-- PostgreSQL's `change_seq` prunes its page earlier (see its migration); SQLite has no
-- fillfactor and numbers changes in the writing transaction. This file keeps both
-- backends' migration lists the same.
SELECT 1;
