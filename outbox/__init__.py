"""The transactional outbox: the DuckDB ledger of staged batches and the relay that commits them to Iceberg."""
