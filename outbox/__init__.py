"""The transactional outbox: the ledger of staged batches (a DuckDB file or a PostgreSQL schema) and the relay that
commits them to Iceberg."""
