"""Session-scoped real services the tests start once when asked for: a REST catalog, an S3 endpoint, a Spark
cluster, a secured Kafka listener and an OTLP receiver."""
