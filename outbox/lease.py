"""Holding a pipeline's stager lease while its Spark query runs, renewed in the background.

A Spark checkpoint admits one running query. ``krishiv run`` (continuous or once) and a Dagster staging
run both take the pipeline's lease in the ledger first, so they never start the same query twice, and the
Kafka sensor leaves a pipeline alone while someone holds it.

The lease also fences: a process that lost it (paused past its expiry, partitioned from the ledger, taken
over by another stager) must stop before staging another batch. :func:`stager_lease` yields a
:class:`HeldLease`; its renewer thread sets ``lost`` as soon as a renewal finds the lease expired or held by
another process, and the stager checks ``lost`` (or calls :meth:`HeldLease.ensure_held`) before each batch and
passes ``held.lease`` to :meth:`Ledger.record_batch`, which checks again in the transaction that records the
batch. A renewal that fails for a while (ledger busy) is only logged: the lease is lost only when the ledger
says so, or when it has certainly expired.

A holder that commits each batch itself right after staging it (a continuous ``krishiv run`` with its
committer) takes the lease with ``committing=True``: the Dagster outbox sensor then leaves fresh pending
entries to it and launches a commit run only for what stays pending past a grace (the committer is down).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from krishiv_core.errors import StagerLeaseLost
from outbox.errors import OutboxError
from outbox.ledger import Ledger
from outbox.ledger.leases import StagerLease

log = logging.getLogger(__name__)

LEASE_TTL_S = 30.0


class HeldLease:
    """The stager lease as held by this process: the ledger's :class:`StagerLease` and whether it was lost.

    Attribute reads it does not define (``pipeline``, ``pid``, ``holder``, …) go to the lease, so code that
    used the yielded value as a :class:`StagerLease` keeps working.
    """

    def __init__(self, lease: StagerLease, ledger: Ledger | None = None) -> None:
        self.lease = lease
        self._ledger = ledger
        self._lost = threading.Event()
        self.lost_reason: str | None = None
        #: The ledger's error when the lease expired because renewals failed (see :func:`outbox.errors.ledger_outage`).
        self.lost_to: BaseException | None = None
        self.left = False  # see leave()

    @property
    def lost(self) -> bool:
        """True once the lease was found expired or taken over; it never becomes False again."""
        return self._lost.is_set()

    def mark_lost(self, reason: str, cause: BaseException | None = None) -> None:
        if not self._lost.is_set():
            self.lost_reason, self.lost_to = reason, cause
            self._lost.set()

    def leave(self) -> None:
        """Leave the lease as it is on exit, not released and its renewer not waited for: the ledger cannot be reached
        now, and a release would wait out its budget. It expires by itself, and this process taking it again (a
        continuous run starting again after the outage) renews it."""
        self.left = True

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the lease is lost or ``timeout`` passes; returns :attr:`lost`."""
        return self._lost.wait(timeout)

    @property
    def committing(self) -> bool:
        """Whether this process said it commits its own batches when it took the lease."""
        return bool(self.lease.committing)

    def ensure_held(self) -> None:
        """Raise :class:`StagerLeaseLost` if the lease was lost: call it before staging a batch."""
        if self.lost:
            raise StagerLeaseLost(self.lease.pipeline, self.lost_reason or "lost")

    def check_ledger(self) -> None:
        """:meth:`ensure_held`, asking the ledger now instead of waiting for the renewer to find out. For what no ledger
        write of its own fences (a batch the ledger holds already, as the run that took the lease over recorded it), and
        to tell why a query failed: resumed from a pause, Spark may fail on the checkpoint logs the new holder wrote
        (``CONCURRENT_STREAM_LOG_UPDATE``) before the renewer looks. A ledger that cannot say leaves it to the
        renewer."""
        if not self.lost and self._ledger is not None:
            try:
                held = self._ledger.lease_held(self.lease)
            except OutboxError:
                held = True
            if not held:
                self.mark_lost(_who_holds(self._ledger, self.lease))
        self.ensure_held()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "lease":
            raise AttributeError(name)
        return getattr(self.lease, name)

    def __repr__(self) -> str:
        return f"HeldLease({self.lease!r}, lost={self.lost})"


def _who_holds(ledger: Ledger, lease: StagerLease) -> str:
    try:
        current = ledger.current_lease(lease.pipeline)
    except OutboxError as exc:
        return f"the ledger could not say who holds it now: {exc}"
    if current is None:
        return "nobody holds it now"
    if current.token != lease.token:
        return f"taken over by {current.describe()}"
    return f"it expired at {current.expires_at.isoformat(timespec='seconds')} before it could be renewed"


@contextmanager
def stager_lease(
    ledger: Ledger, pipeline: str, holder: str, ttl_s: float = LEASE_TTL_S, committing: bool = False
) -> Iterator[HeldLease]:
    """Hold the lease for the duration of the block; raises :class:`StagerBusy` if another process holds it.

    Yields a :class:`HeldLease` whose ``lost`` turns True when the renewer finds the lease gone; the renewer
    then stops, and the lease is not released on exit (it is not this process's to release any more).
    ``committing`` is recorded with the lease: this process commits the batches it stages (see the module).
    """
    held = HeldLease(ledger.acquire_lease(pipeline, holder, ttl_s, committing=committing), ledger)
    stop = threading.Event()

    def renew() -> None:
        # Until when the lease certainly holds, by this process's clock: a renewal counts from when it began.
        valid_until = time.monotonic() + ttl_s
        while not stop.wait(ttl_s / 3):
            attempt = time.monotonic()
            try:
                renewed = ledger.renew_lease(held.lease, ttl_s)
            except OutboxError as exc:  # busy, or unreadable for a moment: the lease may still hold
                log.warning("could not renew the stager lease of pipeline %s: %s", pipeline, exc)
                if time.monotonic() >= valid_until:
                    held.mark_lost(f"it expired while the ledger could not be written: {exc}", exc)
                    log.error("stager lease of pipeline %s expired before it could be renewed", pipeline)
                    return
                continue
            if not renewed:
                held.mark_lost(_who_holds(ledger, held.lease))
                log.error("stager lease of pipeline %s was lost: %s", pipeline, held.lost_reason)
                return
            valid_until = attempt + ttl_s

    renewer = threading.Thread(target=renew, name=f"krishiv-lease-{pipeline}", daemon=True)
    renewer.start()
    try:
        yield held
    finally:
        stop.set()
        if not held.left:
            renewer.join()
        if not (held.lost or held.left):
            try:
                ledger.release_lease(held.lease)
            except OutboxError as exc:  # busy, away, or gone: the row expires by itself
                log.warning(
                    "could not release the stager lease of pipeline %s (it expires by itself): %s", pipeline, exc
                )
