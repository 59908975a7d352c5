"""How long a Dagster staging run stages: once over what the topic holds, or on while events keep arriving.

A staging run pays for a Spark driver (20–30 s on two cores) before its first batch. When each run staged what the
topic held and ended, every wave of events paid it again, plus the Kafka sensor's tick and a run's launch: the
last event of a wave became visible 29–46 s after it was produced. A run the **Kafka sensor** starts therefore
*lingers*: it runs the pipeline's query in continuous mode (its trigger interval) through
:func:`krishiv.operations.run_pipelines`, with the committer beside it, so each batch is visible one commit after it
is staged. It holds the pipeline's stager lease all along, so the sensor leaves the pipeline alone meanwhile, and
the outbox sensor stays the safety net for anything left pending. It stops between batches once no batch has read
a record for the linger, or once it has run for the maximum run time, so every Dagster run stays bounded and
visible in the UI; the next records start a new run.

A run started any other way (**Materialize all** in the UI, a test's ``materialize``) stages once and ends, as
before: the commit step of the same run waits for it.

One machine runs one Spark driver: ``dagster.yaml``'s run queue starts one run of a stage job (tagged
``krishiv/step=stage``) at a time, whichever pipeline, and the others wait. So that a lingering run does not keep a
busy pipeline's queue waiting for up to its maximum run time, it gives way: while a staging run waits in the queue,
it stops between batches once it has run for its linger (:func:`staging_run_waiting`); the Kafka sensor requests
it again for what it left, behind the one that waited.

Settings, until the spec holds them (``[dagster] staging_linger``, ``staging_max_run``): the staging asset's run
config (``linger_s``, ``max_run_s``), else ``KRISHIV_STAGING_LINGER_S`` and ``KRISHIV_STAGING_MAX_RUN_S``, else
:data:`DEFAULT_LINGER_S` and :data:`DEFAULT_MAX_RUN_S`. A linger of 0 is the one-shot run.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import dagster as dg

from krishiv_core.errors import ConfigError, KrishivError
from outbox.ledger import Ledger

if TYPE_CHECKING:
    from krishiv_assets.resources import IcebergCatalogResource, KafkaResource, SparkResource
    from krishiv_core.spec import KrishivSpec, PipelineSpec
    from spark_jobs.staging import StagedBatch

#: How long a sensor-started staging run goes on after the last batch that read a record (seconds; 0: one shot).
LINGER_ENV = "KRISHIV_STAGING_LINGER_S"
#: The longest a sensor-started staging run stages before it stops between batches (seconds).
MAX_RUN_ENV = "KRISHIV_STAGING_MAX_RUN_S"
DEFAULT_LINGER_S = 60.0
DEFAULT_MAX_RUN_S = 3600.0

#: The tag Dagster puts on a run a sensor requested.
SENSOR_TAG = "dagster/sensor_name"
#: The run tag naming a pipeline's step; a stage job's runs carry ``stage``, which dagster.yaml's queue limits.
STEP_TAG, STAGE_STEP = "krishiv/step", "stage"
#: How often a lingering run asks the instance whether a staging run waits in the queue (seconds).
WAITING_POLL_S = 5.0


#: The staging asset's run config (a schema, not a ``dg.Config`` class: the asset module's annotations are strings,
#: which Dagster does not resolve). Both unset by default: the environment's values or the defaults apply.
STAGING_CONFIG_SCHEMA = {
    "linger_s": dg.Field(float, is_required=False, description="seconds of no new records before it stops; 0: once"),
    "max_run_s": dg.Field(float, is_required=False, description="the longest it stages, in seconds"),
}


@dataclass(frozen=True)
class StagingPlan:
    """How one staging run stages: ``linger_s`` 0 is once (``AvailableNow``); otherwise continuous, until idle for
    ``linger_s`` or ``max_run_s`` after the start."""

    linger_s: float
    max_run_s: float

    @property
    def once(self) -> bool:
        return self.linger_s == 0

    def describe(self) -> str:
        if self.once:
            return "once over what the topic holds"
        return f"continuously until idle for {self.linger_s:g}s (at most {self.max_run_s:g}s)"


def _seconds(value: float | str, where: str, *, zero: bool) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ConfigError(where, f"expected a number of seconds, got {value!r}") from None
    if not (seconds >= 0 if zero else seconds > 0) or seconds == float("inf"):
        wanted = "0 or more seconds" if zero else "a positive number of seconds"
        raise ConfigError(where, f"expected {wanted}, got {value!r}")
    return seconds


def staging_plan(
    *,
    sensor_started: bool,
    linger_s: float | None = None,
    max_run_s: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> StagingPlan:
    """The plan of a staging run: the run config's values, else the environment's, else the defaults; a run no
    sensor started stages once unless its config says otherwise. Raises :class:`ConfigError` naming the setting."""
    env = os.environ if environ is None else environ
    if linger_s is not None:
        linger = _seconds(linger_s, "staged_batches config linger_s", zero=True)
    elif not sensor_started:
        linger = 0.0
    elif env.get(LINGER_ENV):
        linger = _seconds(env[LINGER_ENV], LINGER_ENV, zero=True)
    else:
        linger = DEFAULT_LINGER_S
    if max_run_s is not None:
        longest = _seconds(max_run_s, "staged_batches config max_run_s", zero=False)
    elif env.get(MAX_RUN_ENV):
        longest = _seconds(env[MAX_RUN_ENV], MAX_RUN_ENV, zero=False)
    else:
        longest = DEFAULT_MAX_RUN_S
    return StagingPlan(linger, longest)


class IdleStop:
    """The stop condition of a lingering run (``run_pipelines(stop_when=...)``), fed every staged batch.

    True once no batch has read a record for ``plan.linger_s`` (counted from the first question, asked once the
    queries have started) and ``unstaged`` then says the topic holds nothing the ledger has not staged (a first
    batch still planning on a loaded machine is not idleness: the clock starts again), or ``plan.max_run_s`` after it
    was made (the run's start), or ``plan.linger_s`` after it was made while ``waiting`` says another staging run
    waits for the one run the queue allows. :attr:`reason` then says which.
    """

    def __init__(
        self,
        plan: StagingPlan,
        unstaged: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
        waiting: Callable[[], bool] = lambda: False,
    ) -> None:
        self.plan = plan
        self._unstaged = unstaged
        self._waiting = waiting
        self._clock = clock
        self.started = clock()
        self._quiet_since: float | None = None
        self._lock = threading.Lock()  # batches arrive on Spark's thread, the question on the driver's
        self.reason: str | None = None

    def on_batch(self, batch: StagedBatch) -> None:
        if batch.records_read:
            with self._lock:
                self._quiet_since = self._clock()

    def __call__(self) -> bool:
        now = self._clock()
        with self._lock:
            if self._quiet_since is None:
                self._quiet_since = now  # Spark's start is not idleness
            quiet = now - self._quiet_since
        if now - self.started >= self.plan.max_run_s:
            self.reason = f"ran for its maximum of {self.plan.max_run_s:g}s"
        elif now - self.started >= self.plan.linger_s and self._waiting():
            self.reason = f"gave way after {now - self.started:.0f}s to a staging run waiting in the queue"
        elif quiet >= self.plan.linger_s:
            if self._unstaged():
                with self._lock:
                    self._quiet_since = self._clock()
            else:
                self.reason = f"no new records for {self.plan.linger_s:g}s"
        return self.reason is not None


def staging_run_waiting(
    instance: dg.DagsterInstance, poll_s: float = WAITING_POLL_S, clock: Callable[[], float] = time.monotonic
) -> Callable[[], bool]:
    """Whether a run of a stage job (any pipeline's) waits in ``instance``'s queue, asked at most every ``poll_s``
    (the answer kept meanwhile); an instance that does not answer has none waiting (the run lingers on)."""
    asked_at, answer = -poll_s, False

    def ask() -> bool:
        nonlocal asked_at, answer
        if clock() - asked_at >= poll_s:
            asked_at = clock()
            try:
                answer = bool(
                    instance.get_run_records(
                        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED], tags={STEP_TAG: STAGE_STEP}),
                        limit=1,
                    )
                )
            except Exception:  # the instance's storage is busy or away: linger on, ask again later
                answer = False
        return answer

    return ask


def unstaged_records(
    spec: KrishivSpec, pipeline: PipelineSpec, ledger: Ledger, kafka: KafkaResource
) -> Callable[[], bool]:
    """Whether the topic holds records beyond the offsets the ledger has staged (the Kafka sensor's question);
    False when the broker or the ledger does not answer (the run stops; the sensor asks again later)."""
    from krishiv_core.catalog import qualified

    table = qualified(spec, pipeline.tables[0])

    def ask() -> bool:
        try:
            staged = staged_offsets(ledger, table, pipeline)
            latest = latest_offsets(spec, pipeline, kafka)
        except KrishivError:
            return False
        return any(end > staged.get(p, 0) for p, end in latest.items())

    return ask


def _labels(pipeline: PipelineSpec, topic: str, offsets: Mapping[str, int]) -> dict[str, int]:
    """A topic's offsets by partition, as ``topic/partition`` for a pipeline over several topics."""
    return dict(offsets) if not pipeline.members else {f"{topic}/{p}": o for p, o in offsets.items()}


def staged_offsets(ledger: Ledger, table: str, pipeline: PipelineSpec) -> dict[str, int]:
    """The end offsets the ledger has staged for every topic of the pipeline (:func:`_labels`)."""
    return {k: o for t in pipeline.topics for k, o in _labels(pipeline, t, ledger.end_offsets(table, t)).items()}


def latest_offsets(spec: KrishivSpec, pipeline: PipelineSpec, kafka: KafkaResource) -> dict[str, int]:
    """Every topic's end offsets (:func:`_labels`); a topic of several that does not exist yet has none."""
    from spark_jobs.errors import TopicMissing

    latest: dict[str, int] = {}
    for topic in pipeline.topics:
        try:
            latest |= _labels(pipeline, topic, kafka.latest_offsets(topic, spec.kafka.consumer_settings()))
        except TopicMissing:
            if not pipeline.members:
                raise
    return latest


def run_spec(
    spec: KrishivSpec, *, kafka: KafkaResource, spark: SparkResource, iceberg: IcebergCatalogResource
) -> KrishivSpec:
    """The spec a staging run hands ``run_pipelines``: the resources' broker, checkpoints and catalog.

    The catalog matters in continuous mode: the committer loads a catalog of its own from the spec (its thread's),
    so it must be the resource's (an address the environment overrides), not the spec file's.
    """
    from dataclasses import replace

    from krishiv_assets.resources import effective_spec

    return replace(
        effective_spec(spec, kafka=kafka, spark=spark),
        iceberg=iceberg._catalog_spec().iceberg,  # the real URI and warehouse behind the resource's shown ones
    )
