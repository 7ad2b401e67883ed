"""A stop-gap for one consumer defect that record processors run into; to go once it is fixed.

The defect (``shardflow.consumer.shard_worker.ShardWorker``, main a13a9ba): the worker keeps an
``_all_acked`` event that only acknowledgements update. Records delivered after a moment when
everything was acknowledged leave it set although they are not acknowledged. A session that
then ends with them unacknowledged (a stop, a handoff, the shard's end) makes ``finish`` wait
in ``_drain`` / ``_finish_shard_end`` with ``while not tracker.all_acked: await
first_of(self._all_acked, ...)``: ``first_of`` returns at once for a set event, so the loop
spins without yielding and blocks the event loop until the lease's deadline passes. Every
lease of the process then expires (measured: 2-2.5 s stalls, leases lost, records handled twice
after a rolling restart). Handlers that acknowledge as they return never meet it; a
processor checkpoints when it chooses, so it meets it at every handoff.

The fix belongs in the worker (clear the event when records are registered, or test
``tracker.all_acked`` in those loops). Until then :func:`settle_ack_event` clears the stale
event right after a batch is received, the one moment it goes stale; it reaches into the
session's worker, checks what it finds, and does nothing when the worker has changed shape.
"""

from __future__ import annotations

import asyncio

from shardflow.consumer import ShardSession


def settle_ack_event(session: ShardSession) -> None:
    """Clear the worker's all-acknowledged event when records are unacknowledged."""
    worker = getattr(session, "_worker", None)
    event = getattr(worker, "_all_acked", None)
    if not isinstance(event, asyncio.Event):
        return
    if event.is_set() and not session.checkpointer.tracker.all_acked:
        event.clear()
