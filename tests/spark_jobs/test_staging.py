"""The staging sink under a lease that fences: a stager that lost its lease stages no further batch."""

from __future__ import annotations

import pytest

from krishiv.operations import open_ledger, run_pipelines
from krishiv_core.catalog import load_catalog
from krishiv_core.errors import StagerLeaseLost
from outbox.lease import HeldLease, stager_lease
from spark_jobs.checkpoint import Checkpoint
from spark_jobs.job import start_pipeline
from tests.spark_jobs.pipeline_helpers import produce_orders


def test_a_stager_that_lost_its_lease_stops_before_the_next_batch(make_spec, spark):
    spec = make_spec(max_records=500)
    produce_orders(spec, 2_000)
    pipeline, ledger = spec.pipeline(), open_ledger(spec)
    with stager_lease(ledger, pipeline.name, "test stager") as held:

        def lose_after_first(batch) -> None:
            held.mark_lost("taken over by another stager (test)")

        running = start_pipeline(
            spark, spec, pipeline, load_catalog(spec), ledger, once=True, on_batch=lose_after_first, lease=held
        )
        with pytest.raises(Exception, match="StagerLeaseLost"):
            running.query.awaitTermination()
    assert [b.batch_id for b in running.stager.history] == [0]
    assert {e.batch_id for e in ledger.entries()} == {0}, "no batch after the loss reached the ledger"
    with pytest.raises(StagerLeaseLost, match="taken over by another stager"):
        held.ensure_held()


def test_a_replay_is_not_passed_by_a_stager_whose_lease_is_lost(make_spec, spark):
    """A batch the ledger holds already is a replay, and records nothing, so no ledger write fences it: a stager that
    lost its lease (the run that took over may have recorded the batch, and written Spark's logs past it) stops there
    rather than pass it on to Spark's commit log. This lease has no renewer: only the ledger can say it is lost."""
    spec = make_spec(max_records=500)
    produce_orders(spec, 1_000)
    pipeline, ledger = spec.pipeline(), open_ledger(spec)
    run_pipelines(spec, [pipeline], once=True, commit=False)
    staged = {e.batch_id for e in ledger.entries()}
    Checkpoint(spec.checkpoint_dir(pipeline)).rewind(1)  # Spark runs the last batch again: the ledger holds it
    expired = HeldLease(ledger.acquire_lease(pipeline.name, "test stager", ttl_s=-1), ledger)

    running = start_pipeline(spark, spec, pipeline, load_catalog(spec), ledger, once=True, lease=expired)
    with pytest.raises(Exception, match="StagerLeaseLost"):
        running.query.awaitTermination()
    assert running.stager.history == [], "the replay was not reported staged"
    assert {e.batch_id for e in ledger.entries()} == staged
    assert not (spec.checkpoint_dir(pipeline) / "commits" / str(max(staged))).exists(), "nor finished in Spark's log"
