"""Holding a pipeline's stager lease while its Spark query runs, renewed in the background.

A Spark checkpoint admits one running query. ``krishiv run`` (continuous or once) and a Dagster staging
run both take the pipeline's lease in the ledger first, so they never start the same query twice, and the
Kafka sensor leaves a pipeline alone while someone holds it. The lease coordinates; it is not what makes
staging exactly-once (the ledger's primary key and the checkpoint do that), so a renewal that fails for a
while (ledger busy) is only logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from outbox.errors import LedgerBusyError
from outbox.ledger import Ledger, StagerLease

log = logging.getLogger(__name__)

LEASE_TTL_S = 30.0


@contextmanager
def stager_lease(ledger: Ledger, pipeline: str, holder: str, ttl_s: float = LEASE_TTL_S) -> Iterator[StagerLease]:
    """Hold the lease for the duration of the block; raises :class:`StagerBusy` if another process holds it."""
    lease = ledger.acquire_lease(pipeline, holder, ttl_s)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(ttl_s / 3):
            try:
                if not ledger.renew_lease(lease, ttl_s):
                    log.error("stager lease of pipeline %s was taken over by another process", pipeline)
                    return
            except LedgerBusyError as exc:
                log.warning("could not renew the stager lease of pipeline %s: %s", pipeline, exc)

    renewer = threading.Thread(target=renew, name=f"krishiv-lease-{pipeline}", daemon=True)
    renewer.start()
    try:
        yield lease
    finally:
        stop.set()
        renewer.join()
        try:
            ledger.release_lease(lease)
        except LedgerBusyError as exc:
            log.warning("could not release the stager lease of pipeline %s (it expires by itself): %s", pipeline, exc)
