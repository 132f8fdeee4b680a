DROP FUNCTION feed_sequence_pass(BIGINT);
