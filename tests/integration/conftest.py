"""Real emulators for integration tests, started on first use and stopped at session end.

- ``moto_url``: moto's server (Kinesis, DynamoDB, DynamoDB Streams, CloudWatch)
- ``kinesis_local_url``: kinesis-local (resharding, enhanced fan-out)
- ``kinesalite_url``: kinesalite (throughput)
- ``stream_name``: a unique, valid stream name per test

Every test in this directory is marked ``integration``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardflow.local import KinesaliteServer, KinesisLocalServer, MotoServer

_HERE = Path(__file__).parent
_NOT_IN_STREAM_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(_HERE):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """moto's server for the whole session."""
    with MotoServer(log_dir=tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="session")
def kinesis_local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KinesisLocalServer]:
    """kinesis-local for the whole session."""
    with KinesisLocalServer(log_dir=tmp_path_factory.mktemp("kinesis-local")) as server:
        yield server


@pytest.fixture(scope="session")
def kinesalite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KinesaliteServer]:
    """kinesalite for the whole session."""
    with KinesaliteServer(log_dir=tmp_path_factory.mktemp("kinesalite")) as server:
        yield server


@pytest.fixture(scope="session")
def moto_url(moto_server: MotoServer) -> str:
    """``http://127.0.0.1:PORT`` of moto's server."""
    return moto_server.endpoint_url


@pytest.fixture(scope="session")
def kinesis_local_url(kinesis_local_server: KinesisLocalServer) -> str:
    """``http://127.0.0.1:PORT`` of kinesis-local."""
    return kinesis_local_server.endpoint_url


@pytest.fixture(scope="session")
def kinesalite_url(kinesalite_server: KinesaliteServer) -> str:
    """``http://127.0.0.1:PORT`` of kinesalite."""
    return kinesalite_server.endpoint_url


@pytest.fixture
def stream_name(request: pytest.FixtureRequest) -> str:
    """A stream name unique to this test run, readable in server logs (<= 128 characters)."""
    test = _NOT_IN_STREAM_NAME.sub("-", request.node.name).strip("-")[:80]
    return f"sf-{test}-{uuid.uuid4().hex[:8]}"
