DROP FUNCTION webhook_reconciler_timestamptz(TEXT);
DROP TABLE typed_views;
