"""One Kinesis client face over the clients of streams reached differently (another account's
role, another region): a consumer of several such streams hands its lease coordinator this,
and every call goes to the client of the stream it names.

Calls name their stream by ``StreamName``, ``StreamARN`` or ``ConsumerARN`` (a fan-out
consumer's ARN begins with its stream's); a call that names none (GetRecords by iterator) goes
to the first stream's client, which is why fetchers are handed their stream's own client.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shardflow.aws.arns import is_arn

_CONSUMER_PART = "/consumer/"


class StreamRoutedKinesis:
    """Routes each call to ``clients[stream]`` by the stream the call names."""

    def __init__(self, clients: Mapping[str, Any]) -> None:
        if not clients:
            raise ValueError("no clients to route to")
        self._clients = dict(clients)
        # The same client under the stream's name and ARN, whichever a call passes.
        self._by_name: dict[str, Any] = {}
        for stream, client in clients.items():
            self._by_name[stream] = client
            if is_arn(stream):
                self._by_name.setdefault(stream.rsplit("/", 1)[-1], client)
        self._default = next(iter(self._clients.values()))

    @property
    def meta(self) -> Any:
        return self._default.meta

    def client_of(self, stream: str | None) -> Any:
        """The client of ``stream`` (a name, a stream ARN or a consumer ARN); the first one
        for a stream not routed here."""
        if not stream:
            return self._default
        if _CONSUMER_PART in stream:
            stream = stream.split(_CONSUMER_PART, 1)[0]
        found = self._by_name.get(stream)
        if found is None and is_arn(stream):
            found = self._by_name.get(stream.rsplit("/", 1)[-1])
        return found if found is not None else self._default

    def __getattr__(self, operation: str) -> Callable[..., Any]:
        def call(**params: Any) -> Any:
            named = params.get("StreamARN") or params.get("StreamName") or params.get("ConsumerARN")
            return getattr(self.client_of(named), operation)(**params)

        return call
