"""What a fetcher tells its owner while it reads: throttled calls and renewed subscriptions.

A :class:`FetchObserver` holds optional callbacks; a fetcher calls them on its event loop, in
the task that reads. They must be quick. An exception they raise is logged and dropped: an
observer never changes what the fetcher does.

The fetchers know nothing of who listens: the consumer turns these calls into its diagnostic
events and metrics; other owners may log or count them as they like.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from shardflow.events import RenewalReason
from shardflow.positions import StartPosition

log = logging.getLogger("shardflow.fetch")

ThrottledHook = Callable[[str, float], None]
"""Called with (operation, delay): Kinesis throttled ``operation`` (``"GetRecords"`` or
``"SubscribeToShard"``) and the fetcher waits ``delay`` seconds before trying again."""

RenewedHook = Callable[[StartPosition, RenewalReason], None]
"""Called with (position, reason) each time a fan-out subscription takes over from an earlier
one that delivered events, as soon as it delivers its own first event (so never for the first
subscription, nor for one refused or silent from its start): ``position`` is where it resumed
reading, ``reason`` why the earlier one ended."""


@dataclass(frozen=True, slots=True)
class FetchObserver:
    """Optional callbacks a fetcher calls as things happen (see the module doc)."""

    on_throttled: ThrottledHook | None = None
    on_renewed: RenewedHook | None = None

    def throttled(self, operation: str, delay: float) -> None:
        """Report a throttled call and the backoff delay before its retry."""
        if self.on_throttled is None:
            return
        try:
            self.on_throttled(operation, delay)
        except Exception:
            log.exception("fetch observer failed on a throttled %s", operation)

    def renewed(self, position: StartPosition, reason: RenewalReason) -> None:
        """Report a subscription opened again at ``position``."""
        if self.on_renewed is None:
            return
        try:
            self.on_renewed(position, reason)
        except Exception:
            log.exception("fetch observer failed on a renewed subscription (%s)", reason)


NO_OBSERVER = FetchObserver()
"""Observes nothing (the fetchers' default)."""
