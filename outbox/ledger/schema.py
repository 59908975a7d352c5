"""The ledger's tables: the migrations that build them, and the orderings that statements over them share.

A file records its schema version in ``ledger_meta``; :meth:`~outbox.ledger.connection.LedgerConnection.migrate`
runs the migrations from that version to :data:`SCHEMA_VERSION`, all in one transaction. Each migration moves
the schema one version on (:data:`MIGRATIONS` in DuckDB's DDL, :data:`POSTGRES_MIGRATIONS` in PostgreSQL's); one
that has shipped is never edited, only followed by another.
The tables: ``outbox`` (one entry per query, table and batch) with ``outbox_offsets`` (its offset ranges, one row
per partition); ``outbox_archive`` with ``outbox_archive_offsets`` and ``outbox_archive_ranges`` (what compaction
folded); ``stager_lease``; ``offset_skips``. ``ledger_meta`` holds the version.
"""

from __future__ import annotations

# Each migration moves the schema from version i to i + 1. Never edit one that has shipped: add another.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE outbox (
        query_id VARCHAR NOT NULL,
        pipeline VARCHAR NOT NULL,
        table_name VARCHAR NOT NULL,
        batch_id BIGINT NOT NULL,
        status VARCHAR NOT NULL,
        intended_snapshot_id BIGINT NOT NULL,
        committed_snapshot_id BIGINT,
        offsets VARCHAR NOT NULL,
        files VARCHAR NOT NULL,
        record_count BIGINT NOT NULL,
        metrics VARCHAR NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        committed_at TIMESTAMPTZ,
        PRIMARY KEY (query_id, table_name, batch_id)
    );
    CREATE INDEX outbox_status ON outbox (table_name, status);
    """,
    """
    CREATE TABLE stager_lease (
        pipeline VARCHAR PRIMARY KEY,
        holder VARCHAR NOT NULL,
        host VARCHAR NOT NULL,
        pid BIGINT NOT NULL,
        acquired_at TIMESTAMPTZ NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL
    );
    """,
    # 3: what the hot paths read, normalised: one row per entry and partition, and the summed metrics as
    # columns, back-filled from the JSON of the entries already there.
    """
    CREATE TABLE outbox_offsets (
        query_id VARCHAR NOT NULL,
        table_name VARCHAR NOT NULL,
        batch_id BIGINT NOT NULL,
        topic VARCHAR NOT NULL,
        partition VARCHAR NOT NULL,
        start_offset BIGINT NOT NULL,
        end_offset BIGINT NOT NULL
    );
    INSERT INTO outbox_offsets
    SELECT o.query_id, o.table_name, o.batch_id, t.topic.key, p.part.key, p.part.value[1], p.part.value[2]
    FROM outbox o,
        unnest(map_entries(CAST(o.offsets AS JSON)::MAP(VARCHAR, MAP(VARCHAR, BIGINT[])))) AS t(topic),
        unnest(map_entries(t.topic.value)) AS p(part);
    DROP INDEX outbox_status;  -- DuckDB alters no table that an index depends on
    ALTER TABLE outbox ADD COLUMN records_read BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE outbox ADD COLUMN rejects BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE outbox ADD COLUMN late_events BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE outbox ADD COLUMN windows BIGINT NOT NULL DEFAULT 0;
    UPDATE outbox SET
        records_read = COALESCE(CAST(json_extract(metrics, '$.records_read') AS BIGINT), 0),
        rejects = COALESCE(CAST(json_extract(metrics, '$.rejects') AS BIGINT), 0),
        late_events = COALESCE(CAST(json_extract(metrics, '$.late_events') AS BIGINT), 0),
        windows = COALESCE(CAST(json_extract(metrics, '$.windows') AS BIGINT), 0);
    CREATE INDEX outbox_status ON outbox (table_name, status);
    """,
    # 4: the archive that compaction folds old COMMITTED entries into, one row per (query, table).
    """
    CREATE TABLE outbox_archive (
        query_id VARCHAR NOT NULL,
        table_name VARCHAR NOT NULL,
        pipeline VARCHAR NOT NULL,
        entries BIGINT NOT NULL,
        record_count BIGINT NOT NULL,
        records_read BIGINT NOT NULL,
        rejects BIGINT NOT NULL,
        late_events BIGINT NOT NULL,
        windows BIGINT NOT NULL,
        min_batch_id BIGINT NOT NULL,
        max_batch_id BIGINT NOT NULL,
        min_created_at TIMESTAMPTZ NOT NULL,
        max_created_at TIMESTAMPTZ NOT NULL,
        last_committed_at TIMESTAMPTZ,
        last_snapshot_id BIGINT,
        last_snapshot_at TIMESTAMPTZ,
        PRIMARY KEY (query_id, table_name)
    );
    CREATE TABLE outbox_archive_offsets (
        query_id VARCHAR NOT NULL,
        table_name VARCHAR NOT NULL,
        topic VARCHAR NOT NULL,
        partition VARCHAR NOT NULL,
        start_offset BIGINT NOT NULL,
        end_offset BIGINT NOT NULL,
        PRIMARY KEY (query_id, table_name, topic, partition)
    );
    """,
    # 5: a lease names its process uniquely (token) and the pid space its pid belongs to (node).
    """
    ALTER TABLE stager_lease ADD COLUMN token VARCHAR;
    ALTER TABLE stager_lease ADD COLUMN node VARCHAR;
    """,
    # 6: operator-approved skips over offsets that cannot be read (deleted by retention, or gone backwards).
    """
    CREATE TABLE offset_skips (
        pipeline VARCHAR NOT NULL,
        query_id VARCHAR NOT NULL,
        topic VARCHAR NOT NULL,
        partition VARCHAR NOT NULL,
        from_offset BIGINT NOT NULL,
        to_offset BIGINT NOT NULL,
        reason VARCHAR NOT NULL,
        operator VARCHAR NOT NULL,
        created_at TIMESTAMPTZ NOT NULL,
        applied_batch_id BIGINT,
        PRIMARY KEY (query_id, topic, partition, from_offset)
    );
    """,
    # 7: how the relay commits an entry (JSON of ``CommitOperation``; NULL is a plain append).
    """
    ALTER TABLE outbox ADD COLUMN operation VARCHAR;
    """,
    # 8: each commit's place in the order of commits (``commit_seq``, from a sequence: the cursor the Dagster
    # sensor reports commits by), who made it and how long the catalog call took; whether a lease's process
    # commits its own batches. Entries committed before this version keep NULLs and are never reported.
    """
    CREATE SEQUENCE outbox_commit_seq START 1;
    ALTER TABLE outbox ADD COLUMN commit_seq BIGINT;
    ALTER TABLE outbox ADD COLUMN committed_by VARCHAR;
    ALTER TABLE outbox ADD COLUMN commit_ms DOUBLE;
    ALTER TABLE stager_lease ADD COLUMN committing BOOLEAN;
    """,
    # 9: the Iceberg schema id of the table schema an entry's files were staged for (its columns' field ids);
    # NULL for entries staged before this version.
    """
    ALTER TABLE outbox ADD COLUMN schema_id INTEGER;
    """,
    # 10: the Kafka topic id (incarnation) each entry was read from, and the archive's offsets per incarnation, so
    # the same (partition, offset) of a re-created topic is told apart from a duplicate ('' where unknown: entries
    # staged before this version, brokers that report no topic id). The old archive ranges are kept under ''. And
    # the Iceberg schema (JSON) an entry's files were staged for, when it changes the table's.
    """
    ALTER TABLE outbox ADD COLUMN topic_id VARCHAR;
    ALTER TABLE outbox ADD COLUMN schema_change VARCHAR;
    CREATE TABLE outbox_archive_ranges (
        query_id VARCHAR NOT NULL,
        table_name VARCHAR NOT NULL,
        topic VARCHAR NOT NULL,
        topic_id VARCHAR NOT NULL,
        partition VARCHAR NOT NULL,
        start_offset BIGINT NOT NULL,
        end_offset BIGINT NOT NULL,
        PRIMARY KEY (query_id, table_name, topic, topic_id, partition)
    );
    INSERT INTO outbox_archive_ranges
    SELECT query_id, table_name, topic, '', partition, start_offset, end_offset FROM outbox_archive_offsets;
    """,
    # 11: the lease's fencing token: a number that grows by one each time another process takes the lease, checked
    # by every write made under it (NULL for a lease taken before this version: the next taker starts at 1).
    """
    ALTER TABLE stager_lease ADD COLUMN epoch BIGINT;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


#: Version 3's back-fill of ``outbox_offsets`` from the entries' JSON, in DuckDB's words.
_DUCKDB_OFFSETS_BACKFILL = (
    "t.topic.key, p.part.key, p.part.value[1], p.part.value[2]\n    FROM outbox o,\n"
    "        unnest(map_entries(CAST(o.offsets AS JSON)::MAP(VARCHAR, MAP(VARCHAR, BIGINT[])))) AS t(topic),\n"
    "        unnest(map_entries(t.topic.value)) AS p(part);"
)


def _in_postgres_sql(migration: str, spellings: dict[str, str]) -> str:
    """``migration`` with each of DuckDB's own spellings replaced by PostgreSQL's (each must be there)."""
    for duckdb_sql, postgres_sql in spellings.items():
        assert duckdb_sql in migration, duckdb_sql
        migration = migration.replace(duckdb_sql, postgres_sql)
    return migration


#: The same migrations in PostgreSQL's SQL: the same tables and columns, version for version. Two are spelled
#: differently: version 3's back-fill reads the JSON with PostgreSQL's functions, version 8 names its double type.
POSTGRES_MIGRATIONS: tuple[str, ...] = tuple(
    {
        2: _in_postgres_sql(
            MIGRATIONS[2],
            {
                _DUCKDB_OFFSETS_BACKFILL: "t.key, p.key, (p.value->>0)::BIGINT, (p.value->>1)::BIGINT\n"
                "    FROM outbox o, jsonb_each(o.offsets::jsonb) AS t, jsonb_each(t.value) AS p;",
                **{
                    f"CAST(json_extract(metrics, '$.{name}') AS BIGINT)": f"(metrics::jsonb->>'{name}')::BIGINT"
                    for name in ("records_read", "rejects", "late_events", "windows")
                },
            },
        ),
        7: _in_postgres_sql(MIGRATIONS[7], {"commit_ms DOUBLE;": "commit_ms DOUBLE PRECISION;"}),
    }.get(version, migration)
    for version, migration in enumerate(MIGRATIONS)
)

#: Order of entries for the relay: by first appearance of their query, then batch id.
COMMIT_ORDER = "MIN(created_at) OVER (PARTITION BY query_id, table_name), query_id, table_name, batch_id"
