"""Session-scoped real services the tests start once: a REST catalog, an S3 endpoint, a Spark cluster, a secured broker."""
