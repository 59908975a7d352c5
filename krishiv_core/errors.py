"""The root exception of the whole project, and the errors of the core (configuration, environment, broker, catalog).

Every layer's errors derive from :class:`KrishivError` (``outbox.errors``, ``spark_jobs.errors``), so the
command line and the Dagster assets catch one class to print one line.
"""

from __future__ import annotations

from krishiv_core.runbook import runbook


class KrishivError(Exception):
    """Base class of every error Krishiv raises on purpose."""


class ConfigError(KrishivError):
    """A pipeline spec or an environment override has a wrong value; the message names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class EnvironmentProblem(KrishivError):
    """Something the machine must provide is missing (Java, a broker binary)."""


class BrokerUnavailable(KrishivError):
    """The Kafka broker did not answer at the configured address."""


class CatalogUnavailable(KrishivError):
    """The Iceberg catalog did not answer; pending entries stay pending."""


class BatchReplayMismatch(KrishivError):
    """A batch id came back with other offsets than the ledger recorded: the checkpoint and ledger disagree."""


class StagerLeaseLost(KrishivError):
    """This process no longer holds the pipeline's stager lease (expired, or taken over); it must stop staging."""

    def __init__(self, pipeline: str, holder: str) -> None:
        super().__init__(
            f"the stager lease of pipeline {pipeline!r} is no longer held by this process ({holder}); "
            f"nothing was written, and this process must stop staging {runbook('Another run holds the pipeline')}"
        )
        self.pipeline = pipeline
        self.holder = holder


class SchemaConflict(KrishivError):
    """A table's schema or partitioning differs from the spec's in a way Krishiv does not evolve; nothing changed."""
