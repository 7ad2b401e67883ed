"""Sessions keep botocore's endpoint data only for the services shardflow uses, and resolve
those exactly as botocore's full data does."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import pytest
from botocore.regions import EndpointResolver
from botocore.session import Session

from shardflow.aws.clients import ClientFactory
from shardflow.aws.endpoint_data import ENDPOINT_PREFIXES, trim_endpoint_data, trimmed
from shardflow.aws.settings import AwsSettings


def full_data() -> dict:  # type: ignore[type-arg]
    data: dict = Session().get_component("data_loader").load_data("endpoints")  # type: ignore[type-arg]
    return data


def test_every_kept_service_resolves_as_with_the_full_data_in_every_region() -> None:
    data = full_data()
    full, trim = EndpointResolver(data), EndpointResolver(trimmed(data))
    assert full.get_available_partitions() == trim.get_available_partitions()
    checked = 0
    for partition in data["partitions"]:
        name = partition["partition"]
        regions = [*partition["regions"], "xx-made-up-1"]
        for service in sorted(ENDPOINT_PREFIXES):
            for flag in (False, True):
                assert full.get_available_endpoints(service, name, flag) == (
                    trim.get_available_endpoints(service, name, flag)
                )
            for region in regions:
                for fips in (False, True):
                    assert full.construct_endpoint(
                        service, region, name, use_fips_endpoint=fips
                    ) == (trim.construct_endpoint(service, region, name, use_fips_endpoint=fips))
                    checked += 1
        for region in partition["regions"]:
            assert full.get_partition_for_region(region) == trim.get_partition_for_region(region)
    assert checked > 900  # 9 services x 2 x every region of 8 partitions


def test_other_services_are_left_out() -> None:
    kept = trimmed(full_data())
    services = {s for partition in kept["partitions"] for s in partition["services"]}
    assert services <= ENDPOINT_PREFIXES
    assert {"kinesis", "dynamodb", "streams.dynamodb", "sts"} <= services


@pytest.mark.parametrize("trim", [False, True])
def test_a_factorys_clients_keep_a_fraction_of_the_data(
    trim: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardflow.aws.clients

    if not trim:  # botocore's own resolver, as before this module
        monkeypatch.setattr(shardflow.aws.clients, "trim_endpoint_data", lambda session: False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")

    async def live_after_clients() -> float:
        factory = ClientFactory(AwsSettings(region="us-east-1"))
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        async with factory.kinesis(), factory.dynamodb():
            gc.collect()
            return (tracemalloc.get_traced_memory()[0] - before) / 2**20

    tracemalloc.start()
    try:
        live = asyncio.run(live_after_clients())
    finally:
        tracemalloc.stop()
    # MiB held by the two clients' session: endpoints.json alone is 6.7 MiB parsed.
    assert (live < 5.0) if trim else (live > 7.0), live


def test_a_client_of_another_service_is_still_made_with_its_usual_endpoint() -> None:
    plain, trim = Session(), Session()
    assert trim_endpoint_data(trim)
    for session in (plain, trim):
        session.set_credentials("k", "s")
    urls = {
        session.create_client("sqs", region_name="eu-west-1").meta.endpoint_url
        for session in (plain, trim)
    }
    assert urls == {"https://sqs.eu-west-1.amazonaws.com"}


@pytest.mark.parametrize("region", ["us-east-1", "cn-north-1", "us-gov-west-1"])
def test_kinesis_clients_get_the_same_endpoint_and_signing_region(region: str) -> None:
    plain, trim = Session(), Session()
    assert trim_endpoint_data(trim)
    metas = []
    for session in (plain, trim):
        session.set_credentials("k", "s")
        client = session.create_client("kinesis", region_name=region)
        metas.append((client.meta.endpoint_url, client.meta.region_name))
    assert metas[0] == metas[1]
