"""A client's User-Agent string is made once per set of features: the same string botocore
would send, whatever the call's features."""

from __future__ import annotations

from typing import Any

from botocore.context import start_as_current_context
from botocore.useragent import register_feature_id

from shardflow.aws import AwsSettings, ClientFactory
from shardflow.aws.user_agent import cache_user_agent


async def test_the_header_is_botocores_string_made_once_per_feature_set() -> None:
    factory = ClientFactory(AwsSettings(region="us-east-1"))
    async with factory.kinesis() as client:
        creator = client._user_agent_creator
        assert "to_string" in vars(creator), "the factory's clients cache their header"
        original = type(creator).to_string
        made: list[str] = []

        def counted(self: Any) -> str:
            made.append(text := original(self))
            return text

        # A fresh cache over a counting builder: what botocore makes, how often.
        del creator.to_string
        type(creator).to_string = counted
        try:
            cache_user_agent(client)
            plain = [creator.to_string() for _ in range(5)]
            with start_as_current_context():
                register_feature_id("WAITER")
                waiter = [creator.to_string() for _ in range(3)]
            again = creator.to_string()
        finally:
            type(creator).to_string = original
        assert made == [plain[0], waiter[0]], "made once per feature set"
        assert len(set(plain)) == 1
        assert plain[0] == again
        assert plain[0] == original(creator), "the same string as botocore's"
        assert "shardflow" in plain[0]
        assert len(set(waiter)) == 1
        assert waiter[0] != plain[0], "a call's features are kept"
        with start_as_current_context():
            register_feature_id("WAITER")
            assert waiter[0] == original(creator)


def test_a_client_without_a_user_agent_creator_is_left_alone() -> None:
    class Bare:
        pass

    bare = Bare()
    cache_user_agent(bare)
    assert vars(bare) == {}
