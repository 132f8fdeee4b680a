ALTER TABLE change_seq RESET (fillfactor);
