DROP TABLE typed_views;
