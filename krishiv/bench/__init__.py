"""``krishiv bench``: the exactly-once pipeline measured beside the raw Kafka limit and an at-least-once baseline."""

DEFAULT_POSTGRES_URI = "postgresql+psycopg://postgres@127.0.0.1:5432/test"  # the relay's second catalog
