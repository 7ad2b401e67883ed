"""The one place that builds AWS clients (asyncio, aiobotocore) from the standard configuration."""

from __future__ import annotations

import difflib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Literal

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import NoRegionError

from shardflow.aws.arns import stream_region
from shardflow.aws.endpoint_data import trim_endpoint_data
from shardflow.aws.kinesis_json import FastParserFactory, serialize_put_records_in_one_pass
from shardflow.aws.redaction import register_secret
from shardflow.aws.roles import role_credentials, serve_credentials
from shardflow.aws.settings import AssumeRole, AwsSettings
from shardflow.aws.user_agent import cache_user_agent
from shardflow.aws.validation import validate_only_foreign_requests
from shardflow.errors import MissingRegionError, UnknownRegionError

NO_REGION = (
    "no AWS region configured: set AWS_REGION (or AWS_DEFAULT_REGION), pass "
    "AwsSettings(region=...) or --region, or set region in your profile in ~/.aws/config"
)

Service = Literal["kinesis", "dynamodb", "dynamodbstreams", "cloudwatch", "s3"]


class ClientFactory:
    """Builds asyncio clients for one :class:`AwsSettings`, sharing one botocore session.

    Clients are async context managers: ``async with factory.kinesis() as kinesis: ...``.
    Long-lived components open one client and keep it; its connection pool is sized by
    ``AwsSettings.max_pool_connections`` so that many shards can share it.
    """

    def __init__(self, settings: AwsSettings | None = None) -> None:
        self.settings = settings or AwsSettings()
        self._session: AioSession | None = None
        # One session per role and region, so that every client of a role shares its
        # credentials (and their refreshes).
        self._role_sessions: dict[tuple[AssumeRole, str | None], AioSession] = {}

    @property
    def session(self) -> AioSession:
        if self._session is None:
            self._session = self._new_session()
        return self._session

    def _new_session(self) -> AioSession:
        session = get_session()
        # GetRecords and PutRecords answers read in one pass (see kinesis_json).
        session.register_component("response_parser_factory", FastParserFactory())
        trim_endpoint_data(session)  # 6.7 MiB of endpoint data for ~300 services: a few kept
        if self.settings.profile:
            session.set_config_variable("profile", self.settings.profile)
        return session

    def _session_for(
        self, role: AssumeRole | None, region: str | None, stream: str | None
    ) -> AioSession:
        """The base session, or the one whose credentials are ``role``'s (made once)."""
        if role is None:
            return self.session
        key = (role, region)
        session = self._role_sessions.get(key)
        if session is None:
            credentials = role_credentials(
                self.session,
                role,
                sts_client_kwargs=self._endpoint_kwargs("sts", region),
                stream=stream,
            )
            session = self._new_session()
            serve_credentials(session, credentials)
            self._role_sessions[key] = session
        return session

    def _endpoint_kwargs(
        self, service: Service | Literal["sts"], region: str | None
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"config": self.config()}
        if region:
            kwargs["region_name"] = region
        if self.settings.endpoint_url:
            kwargs["endpoint_url"] = self.settings.endpoint_url
            if self.settings.endpoint_url.lower().startswith("http://"):
                # Nothing to verify on plain HTTP (a local emulator); without this aiobotocore
                # still loads the CA bundle into an SSL context, ~25 ms of CPU per client.
                kwargs["verify"] = False
        return kwargs

    def config(self, **overrides: Any) -> AioConfig:
        """The clients' botocore config: shardflow's settings, then what
        ``AwsSettings.botocore_config`` sets (it wins), then ``overrides`` (a client's own
        purpose, e.g. a fan-out client's read timeout)."""
        s = self.settings
        options: dict[str, Any] = {
            "connect_timeout": s.connect_timeout,
            "read_timeout": s.read_timeout,
            "max_pool_connections": s.max_pool_connections,
            "retries": {"total_max_attempts": s.sdk_max_attempts, "mode": "standard"},
            "user_agent_extra": "shardflow",
        }
        config = AioConfig(**options)
        if s.botocore_config is not None:
            # AioConfig.merge keeps what the other config set over its own (botocore's rule).
            config = config.merge(s.botocore_config)
        if overrides:
            config = config.merge(AioConfig(**overrides))
        return config

    def validates_every_call(self) -> bool:
        """Whether the user asked for botocore's validation of every call
        (``parameter_validation=True`` set in ``AwsSettings.botocore_config``)."""
        user = self.settings.botocore_config
        provided = getattr(user, "_user_provided_options", {}) if user is not None else {}
        return bool(provided.get("parameter_validation", False))

    @asynccontextmanager
    async def client(
        self,
        service: Service,
        *,
        stream: str | None = None,
        own_requests: bool = False,
        **config_overrides: Any,
    ) -> AsyncIterator[Any]:
        """An open client for ``service``; closed when the block ends.

        ``own_requests``: the client carries only requests shardflow builds itself (a
        fetcher's reads, a lease store's writes), so botocore's parameter validation is
        skipped for those operations (:mod:`shardflow.aws.validation`); every other client,
        and every client of a user who asked for ``parameter_validation=True``, validates
        every call.

        ``stream`` (Kinesis only; a name or an ARN) is the stream the client is for: this is
        the one place where a stream and its settings become a client. A stream ARN gives the
        region when none is configured (a malformed ARN or another region than the configured
        one raises a :class:`~shardflow.errors.ConfigurationError`), and the stream's role
        (``AwsSettings.role_for``) gives the credentials: assumed on opening, so that a refused
        role raises :class:`~shardflow.errors.AssumeRoleError` here, and refreshed by botocore
        before they expire."""
        role: AssumeRole | None = None
        region = self.settings.region
        if service == "kinesis":
            region = stream_region(stream, region)
            role = self.settings.role_for(stream)
        session = self._session_for(role, region, stream)
        if session is not self.session:
            await _register_credentials(self.session)
        await _register_credentials(session)
        kwargs = self._endpoint_kwargs(service, region)
        kwargs["config"] = self.config(**config_overrides)
        async with AsyncExitStack() as stack:
            try:
                client = await stack.enter_async_context(session.create_client(service, **kwargs))
            except NoRegionError:
                raise MissingRegionError(NO_REGION) from None
            if own_requests and not self.validates_every_call():
                # Before the PutRecords writer wraps it: PutRecords (user data) stays validated.
                validate_only_foreign_requests(client)
            if service == "kinesis":
                serialize_put_records_in_one_pass(client)
            cache_user_agent(client)  # made once, not twice per request (see user_agent)
            await _name_an_unknown_region(session, client, service)
            yield client

    def kinesis(
        self, stream: str | None = None, *, own_requests: bool = False, **config_overrides: Any
    ) -> Any:
        """A Kinesis client for ``stream`` (see :meth:`client`); None: for streams by name
        under the configured region and ``AwsSettings.role``."""
        return self.client("kinesis", stream=stream, own_requests=own_requests, **config_overrides)

    def dynamodb(self, *, own_requests: bool = False, **config_overrides: Any) -> Any:
        return self.client("dynamodb", own_requests=own_requests, **config_overrides)

    def dynamodbstreams(self, *, own_requests: bool = False, **config_overrides: Any) -> Any:
        return self.client("dynamodbstreams", own_requests=own_requests, **config_overrides)

    def cloudwatch(self, **config_overrides: Any) -> Any:
        return self.client("cloudwatch", **config_overrides)


async def _register_credentials(session: AioSession) -> None:
    # Whatever credentials the chain resolves are masked in every shardflow message; the access
    # key id too, since it need not look like AKIA... (emulators, custom providers). For a role
    # this is its first AssumeRole call: a refusal surfaces when the client is opened.
    credentials = await session.get_credentials()
    if credentials is not None:
        frozen = await credentials.get_frozen_credentials()
        register_secret(frozen.access_key, frozen.secret_key, frozen.token)


class OpenClients(ClientFactory):
    """A :class:`ClientFactory` that hands out clients already open: a test's fake (e.g.
    :class:`shardflow.testing.MemoryKinesis`) or a client of your own. They stay the caller's:
    leaving a block does not close them. Services not given are built from ``settings`` as
    :class:`ClientFactory` does.

    ::

        Consumer("orders", "billing", clients=OpenClients(kinesis=memory_kinesis), ...)
        Producer("orders", clients=OpenClients(kinesis=kinesis))
    """

    def __init__(
        self,
        settings: AwsSettings | None = None,
        *,
        kinesis: Any | None = None,
        dynamodb: Any | None = None,
        dynamodbstreams: Any | None = None,
    ) -> None:
        super().__init__(settings)
        self._given: dict[str, Any] = {
            service: client
            for service, client in (
                ("kinesis", kinesis),
                ("dynamodb", dynamodb),
                ("dynamodbstreams", dynamodbstreams),
            )
            if client is not None
        }

    @asynccontextmanager
    async def client(
        self,
        service: Service,
        *,
        stream: str | None = None,
        own_requests: bool = False,
        **config_overrides: Any,
    ) -> AsyncIterator[Any]:
        """The client given for ``service`` (left open), else a new one closed at the end."""
        given = self._given.get(service)
        if given is not None:
            yield given
            return
        opening = super().client(
            service, stream=stream, own_requests=own_requests, **config_overrides
        )
        async with opening as client:
            yield client


async def _name_an_unknown_region(session: AioSession, client: Any, service: Service) -> None:
    """When the client's region is none botocore knows, an answer of 5xx with a web page (moto's
    server, asked about a region it does not serve) raises :class:`UnknownRegionError` naming
    the region, instead of a retryable 500 whose message is the page. Known regions (nearly
    always) add nothing to a call."""
    region = client.meta.region_name
    known: set[str] = set()
    for partition in session.get_available_partitions():
        known.update(await session.get_available_regions(service, partition))
    if not region or not known or region in known:
        return
    closest = _closest(region, known)
    endpoint = client.meta.endpoint_url

    def refuse_web_page(http_response: Any, model: Any, **_: Any) -> None:
        content_type = str(http_response.headers.get("content-type", ""))
        if http_response.status_code >= 500 and content_type.startswith("text/html"):
            raise UnknownRegionError(
                region,
                closest=closest,
                endpoint=endpoint,
                status=http_response.status_code,
                operation=model.name,
            )

    client.meta.events.register("after-call", refuse_web_page)


def _closest(region: str, known: set[str]) -> tuple[str, ...]:
    """The known regions most like ``region`` (all that tie: us-est-1 is us-east-1 or
    us-west-1), or none when nothing is much alike."""
    scores = {name: difflib.SequenceMatcher(None, region, name).ratio() for name in known}
    best = max(scores.values())
    return tuple(sorted(n for n, s in scores.items() if s == best)) if best >= 0.6 else ()
