"""The fault proxy's side towards the emulator: forwarding, relaying, hanging up."""

from __future__ import annotations

import json
import logging
from typing import Any, Final

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from shardflow.shards import ShardInfo, ShardMap

log = logging.getLogger("shardflow.testing.faults")

# Headers that belong to one connection, or that aiohttp recomputes for the body it sends.
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "expect",
    }
)
_LIST_SHARDS_PAGES: Final = 20

Answer = tuple[int, CIMultiDictProxy[str], bytes]


class UpstreamClient:
    """Sends client requests on to the emulator at ``base_url``."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._shard_maps: dict[str, ShardMap] = {}

    async def open(self) -> None:
        self._session = aiohttp.ClientSession(
            auto_decompress=False,
            # Streams (SubscribeToShard) may stay open for minutes: no read timeout here.
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
            connector=aiohttp.TCPConnector(limit=256),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the upstream client is not open")
        return self._session

    async def fetch(self, request: web.Request, body: bytes) -> Answer | None:
        """Send the request with ``body`` and read the whole answer; None if that failed."""
        headers = _forwardable(request.headers)
        # The answer may be rewritten: ask for it uncompressed.
        headers["Accept-Encoding"] = "identity"
        try:
            async with self.session.request(
                request.method,
                self.base_url + request.path_qs,
                headers=headers,
                data=body,
                allow_redirects=False,
            ) as up:
                return up.status, up.headers, await up.read()
        except (aiohttp.ClientError, OSError) as exc:
            log.debug("upstream request failed: %s", type(exc).__name__)
            return None

    async def relay(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """Send the request on and stream the answer back chunk by chunk, unchanged."""
        try:
            async with self.session.request(
                request.method,
                self.base_url + request.path_qs,
                headers=_forwardable(request.headers),
                data=body,
                allow_redirects=False,
            ) as up:
                response = web.StreamResponse(
                    status=up.status, reason=up.reason, headers=_forwardable(up.headers)
                )
                if up.content_length is not None:
                    response.content_length = up.content_length
                await response.prepare(request)
                async for chunk in up.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except ConnectionError:
            # The client hung up (e.g. ended a SubscribeToShard stream): nothing to answer.
            return hang_up(request)
        except (aiohttp.ClientError, OSError) as exc:
            # The emulator failed us: the client sees what it would see without the proxy.
            log.debug("upstream request failed: %s", type(exc).__name__)
            return hang_up(request)

    async def shard_map(self, request: web.Request, stream: str) -> ShardMap | None:
        """The open shards of ``stream`` (asked once, with the client's headers); None if unknown."""
        if stream in self._shard_maps:
            return self._shard_maps[stream]
        headers = _forwardable(request.headers)
        headers["X-Amz-Target"] = "Kinesis_20131202.ListShards"
        headers["Accept-Encoding"] = "identity"
        shards: list[ShardInfo] = []
        params: dict[str, Any] = {"StreamName": stream}
        for _ in range(_LIST_SHARDS_PAGES):
            try:
                async with self.session.post(
                    self.base_url + "/", headers=headers, data=json.dumps(params).encode()
                ) as up:
                    if up.status != 200:
                        return None
                    page = json.loads(await up.read())
            except (aiohttp.ClientError, OSError, ValueError):
                return None
            shards.extend(ShardInfo.from_api(raw) for raw in page.get("Shards", []))
            token = page.get("NextToken")
            if not token:
                break
            params = {"NextToken": token}
        self._shard_maps[stream] = ShardMap(shards)
        return self._shard_maps[stream]


def _forwardable(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _HOP_BY_HOP)


def hang_up(request: web.Request, *, reset: bool = False) -> web.StreamResponse:
    """Close the client's connection without an answer (``reset``: abort it with a TCP RST)."""
    transport = request.transport
    if transport is not None:
        if reset:
            transport.abort()
        else:
            transport.close()
    # aiohttp tries to send this on the closed connection and quietly gives up.
    return web.Response()


def client_gone(request: web.Request) -> bool:
    """Whether the client has closed its connection."""
    transport = request.transport
    return transport is None or transport.is_closing()


def reply_with(answer: Answer) -> web.Response:
    """An upstream answer read by :meth:`UpstreamClient.fetch`, passed on unchanged."""
    status, headers, body = answer
    return web.Response(status=status, body=body, headers=_forwardable(headers))
