-- PostgreSQL's sequencer pass became one function (see its migration); SQLite numbers
-- changes in the writing transaction and needs nothing. This file keeps both backends'
-- migration lists the same.
SELECT 1;
