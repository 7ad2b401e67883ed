"""A shard's fetch observations as the consumer's diagnostic events and metrics.

The fetchers report throttling and renewed subscriptions through a
:class:`~shardflow.fetch.FetchObserver` and know nothing of events; this module turns
those reports into :class:`~shardflow.events.FetchThrottled` and
:class:`~shardflow.events.SubscriptionRenewed` for one shard, and counts them.
"""

from __future__ import annotations

from collections.abc import Callable

from shardflow.clock import Clock
from shardflow.consumer.metrics import ConsumerMetrics
from shardflow.events import DiagnosticEvent, FetchThrottled, RenewalReason, SubscriptionRenewed
from shardflow.fetch.observer import FetchObserver
from shardflow.positions import StartPosition


def shard_fetch_observer(
    *,
    stream: str,
    shard_id: str,
    worker_id: str,
    consumer_name: str | None,
    clock: Clock,
    emit: Callable[[DiagnosticEvent], None],
    metrics: ConsumerMetrics,
) -> FetchObserver:
    """An observer for the fetchers of one shard that counts what they report in ``metrics``
    and passes it to ``emit`` as events. ``consumer_name``: the enhanced fan-out consumer
    (None when polling: there are no subscriptions to renew)."""

    def throttled(operation: str, delay: float) -> None:
        metrics.fetch_throttled(stream)
        emit(
            FetchThrottled(
                worker_id=worker_id,
                at=clock.wall(),
                stream=stream,
                shard_id=shard_id,
                operation=operation,
                delay=delay,
            )
        )

    if consumer_name is None:
        return FetchObserver(on_throttled=throttled)
    subscriber = consumer_name

    def renewed(position: StartPosition, reason: RenewalReason) -> None:
        metrics.subscription_renewed(stream)
        emit(
            SubscriptionRenewed(
                worker_id=worker_id,
                at=clock.wall(),
                stream=stream,
                shard_id=shard_id,
                consumer_name=subscriber,
                position=str(position),
                reason=reason,
            )
        )

    return FetchObserver(on_throttled=throttled, on_renewed=renewed)
