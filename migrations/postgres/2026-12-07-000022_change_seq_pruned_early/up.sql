-- `change_seq` is one row that every pass updates, and a pass reads it twice (its lock
-- and its update) by scanning the table's one page. Each update leaves the old version
-- on that page, and with the default fillfactor PostgreSQL prunes a page only once it
-- is about 90% full: a scan then looks at up to ~170 versions of the one row. In
-- `perf record -a` of benches/feed_writers.sh's writers (24) and pass, that scan was
-- 2.2% of all the machine's samples. Fillfactor 10 makes a read prune the page once it
-- is 10% full (about twenty versions): 0.06% in the same measurement.
ALTER TABLE change_seq SET (fillfactor = 10);
