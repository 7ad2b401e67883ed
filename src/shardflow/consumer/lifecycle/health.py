"""Whether a consumer is healthy, as a probe asks: alive, and ready to be counted on.

- **Live**: the process answers and its event loop turns (the probe's question reaches the loop
  and comes back within a bound): :meth:`Consumer.health` times out otherwise.
- **Ready**: running, and nothing it holds is stuck. Not ready while it is not started or
  stopping; while a shard is parked (a handler failure under ``stop-shard``) or failed; while
  a held lease went unrenewed for more than two renew intervals (the lease table is out of
  reach: the lease lapses at ``failover_time``, so this turns not-ready before that); while a
  held shard that is not caught up handled nothing for ``stall_after`` seconds. A worker that
  holds no shard (more workers than shards) is ready: it has nothing to be stuck on.

Each reason is one line naming the shard and what is wrong, for the probe's response body.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardflow.consumer.lifecycle.status import ConsumerStatus

STALL_AFTER = 120.0
"""Seconds a held shard that is not caught up may handle nothing before the consumer is not
ready (a handler that hangs, a fetch that never returns)."""


@dataclass(frozen=True, slots=True)
class Health:
    """A consumer's health; ``reasons`` say why it is not ready (empty when it is)."""

    live: bool
    ready: bool
    reasons: tuple[str, ...] = ()

    def describe(self) -> str:
        """The probe's response body: ``ok``, or one reason a line."""
        if self.ready:
            return "ok"
        return "\n".join(self.reasons) or "not ready"


def readiness(
    status: ConsumerStatus | None,
    *,
    renew_every: float,
    stall_after: float = STALL_AFTER,
) -> Health:
    """The health of a live consumer from its :class:`ConsumerStatus` (None: not running)."""
    if status is None:
        return Health(live=True, ready=False, reasons=("not running (not started, or stopping)",))
    reasons: list[str] = []
    for lease_key, error in status.parked.items():
        reasons.append(f"shard {lease_key} is parked: {type(error).__name__}: {error}")
    for lease_key, error in status.failed.items():
        reasons.append(f"shard {lease_key} failed: {type(error).__name__}: {error}")
    for shard in status.shards:
        if shard.unrenewed_for is not None and shard.unrenewed_for > 2 * renew_every:
            reasons.append(
                f"shard {shard.shard_id}: lease not renewed for {shard.unrenewed_for:.1f} s "
                "(the lease table is out of reach?)"
            )
        if not shard.caught_up and shard.idle_for is not None and shard.idle_for > stall_after:
            reasons.append(
                f"shard {shard.shard_id}: nothing handled for {shard.idle_for:.0f} s "
                "and not caught up"
            )
    return Health(live=True, ready=not reasons, reasons=tuple(reasons))
