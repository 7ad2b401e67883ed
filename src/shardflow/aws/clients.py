"""The one place that builds AWS clients (asyncio, aiobotocore) from the standard configuration."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Literal

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession, get_session
from botocore.exceptions import NoRegionError

from shardflow.aws.kinesis_json import FastParserFactory, serialize_put_records_in_one_pass
from shardflow.aws.redaction import register_secret
from shardflow.aws.settings import AwsSettings
from shardflow.errors import MissingRegionError

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

    @property
    def session(self) -> AioSession:
        if self._session is None:
            session = get_session()
            # GetRecords and PutRecords answers read in one pass (see kinesis_json).
            session.register_component("response_parser_factory", FastParserFactory())
            if self.settings.profile:
                session.set_config_variable("profile", self.settings.profile)
            self._session = session
        return self._session

    def config(self, **overrides: Any) -> AioConfig:
        s = self.settings
        options: dict[str, Any] = {
            "connect_timeout": s.connect_timeout,
            "read_timeout": s.read_timeout,
            "max_pool_connections": s.max_pool_connections,
            "retries": {"total_max_attempts": s.sdk_max_attempts, "mode": "standard"},
            "user_agent_extra": "shardflow",
        }
        options.update(overrides)
        return AioConfig(**options)

    @asynccontextmanager
    async def client(self, service: Service, **config_overrides: Any) -> AsyncIterator[Any]:
        """An open client for ``service``; closed when the block ends."""
        await self._register_credentials()
        kwargs: dict[str, Any] = {"config": self.config(**config_overrides)}
        if self.settings.region:
            kwargs["region_name"] = self.settings.region
        if self.settings.endpoint_url:
            kwargs["endpoint_url"] = self.settings.endpoint_url
            if self.settings.endpoint_url.lower().startswith("http://"):
                # Nothing to verify on plain HTTP (a local emulator); without this aiobotocore
                # still loads the CA bundle into an SSL context, ~25 ms of CPU per client.
                kwargs["verify"] = False
        async with AsyncExitStack() as stack:
            try:
                client = await stack.enter_async_context(
                    self.session.create_client(service, **kwargs)
                )
            except NoRegionError:
                raise MissingRegionError(NO_REGION) from None
            if service == "kinesis":
                serialize_put_records_in_one_pass(client)
            yield client

    def kinesis(self, **config_overrides: Any) -> Any:
        return self.client("kinesis", **config_overrides)

    def dynamodb(self, **config_overrides: Any) -> Any:
        return self.client("dynamodb", **config_overrides)

    def dynamodbstreams(self, **config_overrides: Any) -> Any:
        return self.client("dynamodbstreams", **config_overrides)

    def cloudwatch(self, **config_overrides: Any) -> Any:
        return self.client("cloudwatch", **config_overrides)

    async def _register_credentials(self) -> None:
        # Whatever credentials the chain resolves are masked in every shardflow message; the
        # access key id too, since it need not look like AKIA... (emulators, custom providers).
        credentials = await self.session.get_credentials()
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
    async def client(self, service: Service, **config_overrides: Any) -> AsyncIterator[Any]:
        """The client given for ``service`` (left open), else a new one closed at the end."""
        given = self._given.get(service)
        if given is not None:
            yield given
            return
        async with super().client(service, **config_overrides) as client:
            yield client
