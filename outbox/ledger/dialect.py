"""Where the ledger's SQL differs between its two databases: DuckDB (a file) and PostgreSQL (a server).

Every statement of the ledger package is written once, with ``?`` placeholders, in the SQL both databases speak;
the few fragments they spell differently come from the :class:`Dialect` of the ledger's backend. (No ``?`` may
appear in a literal: PostgreSQL's driver takes each for a placeholder.) DuckDB keeps the
forms it plans fastest (``arg_max``, ``SEMI``/``ANTI`` joins, ``TRY_CAST``), which the ledger benchmark measured.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dialect:
    """The SQL fragments one database spells its own way."""

    name: str  # "DuckDB" or "PostgreSQL", as messages name the database
    migrations: tuple[str, ...]  # the schema's migrations, one per version, in this database's DDL
    #: Order of partitions: by number where the name is one, then by name.
    partition_order: str
    #: The highest ``commit_seq`` the sequence has handed out (NULL if none yet).
    last_sequence_value: str
    #: A CTE body ``wanted(p, o)`` pairing two BIGINT array parameters element by element.
    zipped_pairs: str

    def restart_sequence(self, last_value: int) -> list[str]:
        """Statements making ``outbox_commit_seq`` hand out ``last_value + 1`` next."""
        if self.name == "DuckDB":  # DuckDB has no setval; nothing depends on the sequence
            return ["DROP SEQUENCE outbox_commit_seq", f"CREATE SEQUENCE outbox_commit_seq START {last_value + 1}"]
        return [f"SELECT setval('outbox_commit_seq', {last_value})"]

    def arg_max(self, value: str, by: str, where: str | None = None) -> str:
        """``value`` of the row with the greatest non-null ``by`` (among the rows ``where`` holds)."""
        if self.name == "DuckDB":
            return f"arg_max({value}, {by})" + (f" FILTER (WHERE {where})" if where else "")
        condition = f"{by} IS NOT NULL" + (f" AND {where}" if where else "")
        return f"(array_agg({value} ORDER BY {by} DESC) FILTER (WHERE {condition}))[1]"

    def keyed_join(self, keep: bool, subquery: str, alias: str, using: str) -> tuple[str, str]:
        """Join clause and extra WHERE condition keeping the rows that have (``keep``) or lack a match in
        ``subquery``; the subquery's keys are unique, so a plain join never repeats a row."""
        if self.name == "DuckDB":
            return f" {'SEMI' if keep else 'ANTI'} JOIN ({subquery}) {alias} USING ({using})", ""
        if keep:
            return f" JOIN ({subquery}) {alias} USING ({using})", ""
        first = using.split(",")[0].strip()
        return f" LEFT JOIN ({subquery}) {alias} USING ({using})", f"{alias}.{first} IS NULL"


def duckdb_dialect(migrations: tuple[str, ...]) -> Dialect:
    return Dialect(
        name="DuckDB",
        migrations=migrations,
        partition_order="TRY_CAST(partition AS BIGINT), partition",
        last_sequence_value=(
            "SELECT last_value FROM duckdb_sequences() WHERE sequence_name = 'outbox_commit_seq' "
            "AND database_name = current_database()"
        ),
        zipped_pairs="SELECT unnest(?::BIGINT[]) AS p, unnest(?::BIGINT[]) AS o",
    )


def postgres_dialect(migrations: tuple[str, ...]) -> Dialect:
    return Dialect(
        name="PostgreSQL",
        migrations=migrations,
        partition_order=("CASE WHEN partition ~ '^-{0,1}[0-9]{1,18}$' THEN CAST(partition AS BIGINT) END, partition"),
        last_sequence_value="SELECT CASE WHEN is_called THEN last_value END FROM outbox_commit_seq",
        zipped_pairs="SELECT * FROM unnest(?::BIGINT[], ?::BIGINT[]) AS z(p, o)",
    )
