"""SIGTERM and SIGINT as a graceful stop: the first asks the consumer to stop, the second ends it now.

A graceful stop lets in-flight handlers finish, writes every shard's final checkpoint and
releases the leases, so other workers continue at once. A second signal cancels the run: no
final checkpoints, leases expire after the failover time (records since the last checkpoint are
processed again elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterable

log = logging.getLogger("shardflow.consumer")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def install_stop_signals(
    request_stop: Callable[[], None],
    *,
    signals: Iterable[signal.Signals] = STOP_SIGNALS,
) -> Callable[[], None]:
    """Route ``signals`` on the running loop to ``request_stop``; returns the uninstaller.

    Call from the task that runs the consumer: a second signal cancels that task. Where the
    loop cannot handle signals (not the main thread, or Windows) nothing is installed.
    """
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    received = 0

    def on_signal(signum: signal.Signals) -> None:
        nonlocal received
        received += 1
        if received == 1:
            log.warning(
                "%s received: stopping gracefully (send it again to stop at once)", signum.name
            )
            request_stop()
        else:
            log.warning(
                "%s received again: stopping at once, without final checkpoints", signum.name
            )
            if main is not None:
                main.cancel()

    installed: list[signal.Signals] = []
    for signum in signals:
        try:
            loop.add_signal_handler(signum, on_signal, signum)
        except (NotImplementedError, RuntimeError, ValueError):
            log.debug("cannot handle %s on this loop; not installed", signum.name)
            continue
        installed.append(signum)

    def uninstall() -> None:
        for signum in installed:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signum)

    return uninstall
