DROP INDEX pending_fetches_turn_idx;
