"""The staging sink under a lease that fences: a stager that lost its lease stages no further batch."""

from __future__ import annotations

import pytest

from krishiv.operations import open_ledger
from krishiv_core.catalog import load_catalog
from krishiv_core.errors import StagerLeaseLost
from outbox.lease import stager_lease
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
