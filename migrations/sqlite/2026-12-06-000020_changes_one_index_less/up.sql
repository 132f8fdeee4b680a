-- No query reads `changes` by time: the feed reads by seq, retention walks the oldest
-- seqs and looks at their time (feed::sql::prune_changes), a consumer's lag reads from
-- its position on. The index by time was one more entry written for every change by
-- every write (benches/feed_writers.sh: the feed's cost per write).
DROP INDEX changes_changed_at_idx;
