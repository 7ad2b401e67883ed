"""Waiting for the first of several :class:`asyncio.Event` s (stop asked, lease lost, ...)."""

from __future__ import annotations

import asyncio


async def wait_for_any(*events: asyncio.Event) -> None:
    """Return once any of ``events`` is set (at once if one already is)."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
