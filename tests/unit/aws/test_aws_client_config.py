"""The botocore config of shardflow's clients: its own settings, a user's config merged over
them, and parameter validation skipped only for the requests shardflow builds itself.

No server: a call that passes validation goes on to connect to a port nothing listens on and
fails there (EndpointConnectionError); one that fails validation never gets that far."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiobotocore.config import AioConfig
from botocore.config import Config
from botocore.exceptions import EndpointConnectionError, ParamValidationError

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.aws.validation import OWN_REQUESTS, OwnRequestsUnvalidated
from shardflow.fetch.fanout import FanOut, fanout_client

NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing answers


@pytest.fixture(autouse=True)
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")


def factory(config: Config | None = None) -> ClientFactory:
    # One attempt, a short connect timeout: a call that is sent fails at once.
    return ClientFactory(
        AwsSettings(
            endpoint_url=NOWHERE, region="us-east-1", connect_timeout=0.5, botocore_config=config
        )
    )


async def outcome(call: Callable[[], Awaitable[Any]]) -> str:
    """``validated``: refused before sending; ``sent``: it went out (and found no server)."""
    try:
        await call()
    except ParamValidationError:
        return "validated"
    except EndpointConnectionError:
        return "sent"
    raise AssertionError("the call cannot succeed: nothing listens")


# Requests botocore's validation refuses: a string where a number belongs, a number where a
# string belongs.
BAD_GET_RECORDS = {"ShardIterator": "it", "Limit": "ten"}
BAD_UPDATE_ITEM = {"TableName": "t", "Key": {"leaseKey": {"S": "k"}}, "ReturnValues": 7}


async def test_own_requests_are_sent_unvalidated_and_others_validated() -> None:
    own = factory()
    async with (
        own.kinesis(own_requests=True) as kinesis,
        own.dynamodb(own_requests=True) as dynamodb,
    ):
        assert await outcome(lambda: kinesis.get_records(**BAD_GET_RECORDS)) == "sent"
        assert await outcome(lambda: dynamodb.update_item(**BAD_UPDATE_ITEM)) == "sent"
        # A producer's PutRecords carries the user's records: still checked before sending.
        bad_put = {"StreamName": "s", "Records": [{"Data": 5, "PartitionKey": "k"}]}
        assert await outcome(lambda: kinesis.put_records(**bad_put)) == "validated"
        assert await outcome(lambda: kinesis.list_streams(Limit="ten")) == "validated"
        assert await outcome(lambda: dynamodb.list_tables(Limit="ten")) == "validated"


async def test_a_client_that_is_not_only_shardflows_validates_every_call() -> None:
    # The public factory's clients carry user values (an idempotency guard's keys, a metadata
    # store's items, the user's own calls): a wrong one is refused before it is sent.
    async with factory().kinesis() as kinesis, factory().dynamodb() as dynamodb:
        assert not isinstance(dynamodb._serializer, OwnRequestsUnvalidated)
        assert await outcome(lambda: kinesis.get_records(**BAD_GET_RECORDS)) == "validated"
        assert await outcome(lambda: dynamodb.update_item(**BAD_UPDATE_ITEM)) == "validated"


def test_the_skipped_operations_are_the_fetchers_and_the_lease_stores() -> None:
    assert {"GetRecords", "GetShardIterator", "UpdateItem", "PutItem", "Scan"} <= OWN_REQUESTS
    assert not {"PutRecords", "PutRecord", "ListStreams"} & OWN_REQUESTS


async def test_a_user_asking_for_validation_gets_it_for_every_call() -> None:
    async with factory(Config(parameter_validation=True)).kinesis(own_requests=True) as kinesis:
        assert not isinstance(kinesis._serializer, OwnRequestsUnvalidated)
        assert await outcome(lambda: kinesis.get_records(**BAD_GET_RECORDS)) == "validated"


async def test_a_user_turning_validation_off_turns_it_off_everywhere() -> None:
    async with factory(Config(parameter_validation=False)).kinesis() as kinesis:
        assert await outcome(lambda: kinesis.list_streams(Limit="ten")) == "sent"


def test_user_config_wins_where_it_sets_an_option_and_keeps_shardflows_elsewhere() -> None:
    user = Config(read_timeout=99, retries={"total_max_attempts": 4, "mode": "adaptive"})
    config = factory(user).config()
    assert isinstance(config, AioConfig)
    assert config.read_timeout == 99
    assert config.retries == {"total_max_attempts": 4, "mode": "adaptive"}
    assert config.connect_timeout == 0.5  # AwsSettings' own
    assert config.max_pool_connections == 64
    assert config.user_agent_extra == "shardflow"
    # An aiobotocore config works as well, its aiohttp options kept.
    aio = AioConfig(connector_args={"keepalive_timeout": 40})
    assert factory(aio).config().connector_args["keepalive_timeout"] == 40


def test_without_a_user_config_shardflows_settings_hold() -> None:
    config = factory().config()
    assert config.read_timeout == 30.0
    assert config.retries == {"total_max_attempts": 1, "mode": "standard"}


async def test_a_clients_own_purpose_wins_over_the_user_config() -> None:
    # A fan-out client's read timeout outlasts the gap between events, whatever else is set.
    clients = factory(Config(read_timeout=3, max_pool_connections=2))
    async with fanout_client(clients, FanOut(), shards=100) as kinesis:
        assert kinesis.meta.config.read_timeout == FanOut().read_timeout
        assert kinesis.meta.config.max_pool_connections == 116


async def test_the_clients_built_carry_the_merged_config() -> None:
    async with factory(Config(read_timeout=7)).dynamodb() as dynamodb:
        assert dynamodb.meta.config.read_timeout == 7
        assert dynamodb.meta.config.user_agent_extra == "shardflow"


def test_settings_with_a_config_stay_hashable() -> None:
    config = Config(read_timeout=5)
    assert hash(AwsSettings(botocore_config=config)) == hash(AwsSettings(botocore_config=config))
