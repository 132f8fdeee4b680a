-- PostgreSQL reads each account's next fetch from an index (see its migration); SQLite
-- serves one process and keeps its sort. This file keeps both backends' migration
-- lists the same.
SELECT 1;
