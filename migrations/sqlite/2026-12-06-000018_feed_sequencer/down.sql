-- PostgreSQL numbers changes after commit (see its migration); SQLite has one writer
-- at a time and numbers them in the writing transaction, so it needs nothing. This
-- file keeps both backends' migration lists the same.
SELECT 1;
