"""A client's User-Agent header made once per set of features, not twice per request.

botocore assembles the header from ~15 parts (SDK, OS, language, config, features), each one
sanitized character by character, and does it twice for every request (when the request is
built and again just before it is signed). All but the features are fixed for a client's
life, so :func:`cache_user_agent` keeps each string made, keyed by the features in effect
(the client's and those of the call's context, as botocore reads them): the header is the same
string botocore would send, made once. That was ~10% of the CPU of an empty GetRecords call,
the call that an idle shard makes every ``max_idle_time`` (bench/consumer.py's scale part:
1,000 idle shards in the heartbeat lease mode), and of every lease renewal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.context import get_context

_KEPT = 64
"""Strings kept per client: far more than the feature sets a client's calls use."""


def cache_user_agent(client: Any) -> None:
    """Have ``client`` (botocore or aiobotocore) make each distinct User-Agent string once. A
    client without botocore's user-agent creator is left as it is."""
    creator = getattr(client, "_user_agent_creator", None)
    build = getattr(creator, "to_string", None)
    if creator is None or not callable(build) or "to_string" in vars(creator):
        return
    # The instance attribute is what both of botocore's callers find: its request builder and
    # the handler bound to this creator that rebuilds the header before signing.
    creator.to_string = _cached(creator, build)


def _cached(creator: Any, build: Callable[[], str]) -> Callable[[], str]:
    made: dict[tuple[frozenset[str], frozenset[str]], str] = {}

    def to_string() -> str:
        context = get_context()
        features = frozenset(context.features) if context is not None else frozenset()
        key = (features, frozenset(getattr(creator, "_client_features", None) or ()))
        text = made.get(key)
        if text is None:
            if len(made) >= _KEPT:
                made.clear()
            text = made[key] = build()
        return text

    return to_string
