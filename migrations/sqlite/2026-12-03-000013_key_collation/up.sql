-- PostgreSQL's keys become byte-ordered ("C") here; SQLite's TEXT already compares
-- byte by byte (BINARY), so nothing changes.
SELECT 1;
