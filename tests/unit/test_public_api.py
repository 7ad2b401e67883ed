"""The front door: what ``import shardflow`` offers, and the layers behind it."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

import shardflow

ROOT = Path(__file__).resolve().parents[2]

# The documented everyday surface. Adding or removing a name is an API change: update the docs'
# API reference with it (it renders exactly ``shardflow.__all__``).
EVERYDAY_API = {
    # clients and entry points
    "Consumer", "Producer", "SyncProducer", "run_consumer", "read_stream", "read_all", "replay",
    # settings
    "AssumeRole", "AwsSettings", "ClientFactory", "OpenClients", "Backoff", "ConsumerSettings", "CheckpointSettings", "LeaseSettings",
    "Polling", "FanOut", "ProducerSettings", "DispatchSettings",
    "Idempotency", "OrderingMode", "FailurePolicy",
    # records, positions, results, handlers
    "Record", "ConsumedRecord", "ExtendedSequenceNumber", "StartPosition", "PutResult",
    "ShardSession", "Checkpointer", "Handler", "RecordHandler", "BatchHandler",
    "as_bytes", "as_json", "from_function",
    # observing a running consumer
    "ConsumerStatus", "ShardStatus", "ConsumerMetricsSnapshot", "ProducerMetricsSnapshot",
    "DiagnosticEvent",
    # dead letters and idempotency
    "DeadLetter", "JsonLinesDestination", "KinesisDestination",
    "DynamoDBIdempotencyGuard", "InMemoryIdempotencyGuard",
    # errors people catch
    "ShardflowError", "AwsError", "ThrottledError", "TransientError", "ResourceNotFoundError",
    "AccessDeniedError", "AggregationError", "DeserializationError", "RecordTooLargeError",
    "ProducerClosedError", "RecordDeliveryError", "ShardLeaseLostError", "HandlerError",
    "DispatchStoppedError", "RetriesExhaustedError",
    "__version__",
}  # fmt: skip


def test_all_is_the_documented_surface() -> None:
    assert set(shardflow.__all__) == EVERYDAY_API
    assert len(shardflow.__all__) == len(set(shardflow.__all__))


@pytest.mark.parametrize("name", sorted(EVERYDAY_API - {"__version__"}))
def test_every_export_is_importable_and_documented(name: str) -> None:
    value = getattr(shardflow, name)
    if inspect.isclass(value) or inspect.isfunction(value):
        assert inspect.getdoc(value), f"shardflow.{name} has no docstring"


def test_errors_people_catch_share_the_root() -> None:
    for name in shardflow.__all__:
        value = getattr(shardflow, name)
        if inspect.isclass(value) and issubclass(value, Exception):
            assert issubclass(value, shardflow.ShardflowError), name


def test_the_type_checkers_imports_are_generated_from_the_one_list() -> None:
    from support.public_api import INIT, imported

    wanted = {(module, name) for module, names in shardflow._EXPORTS.items() for name in names}
    assert imported(INIT.read_text()) == wanted, "run: python tests/support/public_api.py"
    assert shardflow.__all__ == [*sorted(shardflow._MODULE_OF, key=str.lower), "__version__"]


def test_names_read_as_one_design() -> None:
    """Errors end in ``Error``; ``*Settings`` are frozen dataclasses."""
    import dataclasses

    for name in shardflow.__all__:
        value = getattr(shardflow, name)
        if inspect.isclass(value) and issubclass(value, BaseException):
            assert name.endswith("Error"), name
        if name.endswith("Settings"):
            assert dataclasses.is_dataclass(value), name
            assert value.__dataclass_params__.frozen, name  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("ShardLeaseLost", "ShardLeaseLostError"),
        ("MemoryIdempotencyGuard", "InMemoryIdempotencyGuard"),
    ],
)
def test_renamed_names_work_for_a_release_with_a_warning(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=new):
        value = getattr(shardflow, old)
    assert value is getattr(shardflow, new)
    assert old in (ROOT / "CHANGELOG.md").read_text()


def test_a_withdrawn_name_works_for_a_release_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match="ConsumerMetricsSnapshot"):
        recorder = shardflow.ConsumerMetrics
    assert recorder.__name__ == "ConsumerMetrics"
    assert "ConsumerMetrics" not in shardflow.__all__
    assert "ConsumerMetrics" in (ROOT / "CHANGELOG.md").read_text()


def test_renamed_names_in_their_own_modules_warn_too() -> None:
    import shardflow.errors
    import shardflow.idempotency
    import shardflow.leases

    for module, old, new in [
        (shardflow.errors, "ShardLeaseLost", "ShardLeaseLostError"),
        (shardflow.leases, "LeaseConditionFailed", "LeaseConditionFailedError"),
        (shardflow.idempotency, "MemoryIdempotencyGuard", "InMemoryIdempotencyGuard"),
    ]:
        with pytest.warns(DeprecationWarning, match=new):
            assert getattr(module, old) is getattr(module, new)


def test_every_close_takes_a_timeout() -> None:
    for client in (shardflow.Consumer, shardflow.Producer, shardflow.SyncProducer):
        parameters = inspect.signature(client.close).parameters
        assert "timeout" in parameters, client


def test_one_spelling_per_policy() -> None:
    settings = shardflow.ConsumerSettings(on_error="stop-consumer")
    assert settings.on_error == "stop-consumer"
    assert shardflow.DispatchSettings().on_failure == "stop-shard"
    with pytest.warns(DeprecationWarning, match="stop-shard"):
        old = shardflow.ConsumerSettings(on_error="stop_shard")  # type: ignore[arg-type]
    assert old.on_error == "stop-shard"


def test_entry_points_take_typed_parameters_not_options() -> None:
    for function in (shardflow.run_consumer, shardflow.read_all, shardflow.read_stream):
        kinds = {p.kind for p in inspect.signature(function).parameters.values()}
        assert inspect.Parameter.VAR_KEYWORD not in kinds, function


async def test_async_with_starts_a_consumer_as_it_starts_a_producer() -> None:
    from shardflow.aws import OpenClients
    from shardflow.errors import ResourceNotFoundError
    from shardflow.leases import InMemoryLeaseStore
    from shardflow.testing import MemoryKinesis

    kinesis = MemoryKinesis()
    consumer = shardflow.Consumer(
        "missing",
        "app",
        clients=OpenClients(kinesis=kinesis),
        lease_store=InMemoryLeaseStore("app"),
    )
    with pytest.raises(ResourceNotFoundError):
        async with consumer:
            pass
    producer = shardflow.Producer("missing", clients=OpenClients(kinesis=kinesis))
    with pytest.raises(ResourceNotFoundError):
        async with producer:
            pass


def _import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    cycles.append(sorted(group))
    return cycles


def test_no_import_cycles_between_modules() -> None:
    """Type-only imports count too: a cycle hidden behind TYPE_CHECKING is still a knot."""
    graph = grimp.build_graph("shardflow", exclude_type_checking_imports=False)
    assert _import_cycles(graph) == []


def test_cycle_finder_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "knotted"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from knotted import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from knotted import a\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("knotted", exclude_type_checking_imports=False, cache_dir=None)
    assert _import_cycles(graph) == [["knotted.a", "knotted.b"]]
    sys.modules.pop("knotted", None)


def test_no_lazy_exports_below_the_top() -> None:
    """Packages export eagerly, but for ``shardflow`` itself (see the next test)."""
    import shardflow.consumer
    import shardflow.producer
    import shardflow.testing

    for module in (shardflow.consumer, shardflow.producer, shardflow.testing):
        assert "__getattr__" not in vars(module), module.__name__


def test_the_top_imports_each_name_on_first_use_and_nothing_before() -> None:
    """``import shardflow`` imports none of the API's modules (a Spark worker reading a stream
    imports the source's modules only, not the consumer's); each name, and each module as an
    attribute, is there on first use; the type checker sees every name (TYPE_CHECKING)."""
    assert {n for names in shardflow._EXPORTS.values() for n in names} == EVERYDAY_API - {
        "__version__"
    }
    assert set(dir(shardflow)) >= EVERYDAY_API
    (checking,) = [
        node
        for node in ast.parse(inspect.getsource(shardflow)).body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    seen = {
        (statement.module, alias.name)
        for statement in checking.body
        if isinstance(statement, ast.ImportFrom)
        for alias in statement.names
    }
    assert seen == {(m, n) for m, names in shardflow._EXPORTS.items() for n in names}
    script = (
        "import sys, shardflow.spark.datasource, shardflow.spark.source.stream\n"
        "heavy = ['shardflow.consumer', 'shardflow.producer', 'shardflow.leases',"
        " 'shardflow.deadletter', 'shardflow.idempotency', 'shardflow.reader']\n"
        "print([m for m in heavy if m in sys.modules])\n"
        "import shardflow\n"
        "print(shardflow.Consumer.__module__, shardflow.errors.ShardflowError.__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split("\n")[:2] == ["[]", "shardflow.consumer.consumer ShardflowError"]
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        shardflow.Nope  # noqa: B018
