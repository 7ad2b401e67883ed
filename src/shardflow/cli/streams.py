"""``shardflow stream create|list|describe|reshard|delete``."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from botocore.exceptions import ClientError

from shardflow.aws.backoff import retrying
from shardflow.aws.clients import ClientFactory
from shardflow.aws.kinesis import describe_stream_summary, list_shards, stream_ref, wait_for_active
from shardflow.cli.aws_options import EndpointUrl, Profile, Region, aws_settings, fail, run
from shardflow.cli.stream_tables import print_open_shards, print_stream, print_stream_list
from shardflow.errors import InvalidArgumentError
from shardflow.shards import ShardInfo

app = typer.Typer(help="Create, inspect, reshard and delete streams.", no_args_is_help=True)

Name = Annotated[str, typer.Argument(help="Stream name or ARN.", show_default=False)]
Wait = Annotated[
    bool,
    typer.Option(
        "--wait/--no-wait", help="Wait until the stream is ACTIVE (again, after a change)."
    ),
]
WaitTimeout = Annotated[float, typer.Option("--wait-timeout", help="Seconds to wait at most.")]


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="Name of the new stream.", show_default=False)],
    shards: Annotated[
        int | None,
        typer.Option(
            "--shards", min=1, help="Provisioned stream with this many shards (default 1)."
        ),
    ] = None,
    on_demand: Annotated[
        bool, typer.Option("--on-demand", help="On-demand capacity mode instead of shards.")
    ] = False,
    wait: Wait = True,
    wait_timeout: WaitTimeout = 60.0,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Create a stream (provisioned with --shards N, or --on-demand)."""
    if on_demand and shards is not None:
        fail("give either --shards or --on-demand, not both")
    params: dict[str, Any] = {"StreamName": name}
    if on_demand:
        params["StreamModeDetails"] = {"StreamMode": "ON_DEMAND"}
    else:
        # Only the shard count: StreamModeDetails is unknown to some emulators (kinesalite).
        params["ShardCount"] = shards or 1

    async def work() -> None:
        async with ClientFactory(aws_settings(endpoint_url, region, profile)).kinesis() as kinesis:
            await retrying(
                lambda: _create_stream(kinesis, params), operation="CreateStream", stream=name
            )
            if not wait:
                typer.echo(f"creating stream {name}")
                return
            summary = await wait_for_active(kinesis, name, max_wait=wait_timeout)
            typer.echo(
                f"created stream {name} ({_mode_of(summary)}, "
                f"{summary.get('OpenShardCount', '?')} open shards, ACTIVE)"
            )

    run(work())


@app.command("list")
def list_(
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """List the streams of the account and region."""

    async def work() -> None:
        async with ClientFactory(aws_settings(endpoint_url, region, profile)).kinesis() as kinesis:
            streams = await _list_streams(kinesis)
        print_stream_list(streams)

    run(work())


@app.command()
def describe(
    name: Name,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Show a stream: status, capacity mode, retention and every shard with its lineage."""

    async def work() -> None:
        async with ClientFactory(aws_settings(endpoint_url, region, profile)).kinesis() as kinesis:
            summary = await describe_stream_summary(kinesis, name)
            shards = await list_shards(kinesis, name)
        print_stream(summary, shards)

    run(work())


@app.command()
def reshard(
    name: Name,
    target: Annotated[
        int | None,
        typer.Option("--target", min=1, help="Uniform scaling to this many open shards."),
    ] = None,
    split: Annotated[
        str | None, typer.Option("--split", help="Split this shard in two.", metavar="SHARD")
    ] = None,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            help="With --split: first hash key of the upper child (default: the middle).",
            metavar="HASHKEY",
        ),
    ] = None,
    merge: Annotated[
        tuple[str, str] | None,
        typer.Option("--merge", help="Merge two adjacent shards.", metavar="SHARD_A SHARD_B"),
    ] = None,
    wait: Wait = True,
    wait_timeout: WaitTimeout = 60.0,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Change the shards of a stream: --target N, --split SHARD [--at HASHKEY] or --merge A B."""
    chosen = [
        flag
        for flag, value in (("--target", target), ("--split", split), ("--merge", merge))
        if value is not None
    ]
    if len(chosen) != 1:
        fail("give exactly one of --target, --split and --merge")
    if at is not None and split is None:
        fail("--at goes with --split")

    async def work() -> None:
        async with ClientFactory(aws_settings(endpoint_url, region, profile)).kinesis() as kinesis:
            if target is not None:
                await retrying(
                    lambda: kinesis.update_shard_count(
                        **stream_ref(name), TargetShardCount=target, ScalingType="UNIFORM_SCALING"
                    ),
                    operation="UpdateShardCount",
                    stream=name,
                )
            elif split is not None:
                await _split(kinesis, name, split, at)
            elif merge is not None:
                await retrying(
                    lambda: kinesis.merge_shards(
                        **stream_ref(name), ShardToMerge=merge[0], AdjacentShardToMerge=merge[1]
                    ),
                    operation="MergeShards",
                    stream=name,
                )
            if not wait:
                typer.echo(f"resharding stream {name}")
                return
            await wait_for_active(kinesis, name, max_wait=wait_timeout)
            shards = await list_shards(kinesis, name)
        print_open_shards(name, shards)

    run(work())


@app.command()
def delete(
    name: Name,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    endpoint_url: EndpointUrl = None,
    region: Region = None,
    profile: Profile = None,
) -> None:
    """Delete a stream and every record in it."""
    if not yes and not typer.confirm(f"Delete stream {name} and all its records?"):
        fail("not deleted")

    async def work() -> None:
        async with ClientFactory(aws_settings(endpoint_url, region, profile)).kinesis() as kinesis:
            await retrying(
                lambda: kinesis.delete_stream(**stream_ref(name)),
                operation="DeleteStream",
                stream=name,
            )
        typer.echo(f"deleting stream {name}")

    run(work())


# --- helpers ---------------------------------------------------------------------------------


async def _split(kinesis: Any, stream: str, shard_id: str, at: str | None) -> None:
    shard = _find_shard(await list_shards(kinesis, stream), shard_id)
    if not shard.is_open:
        fail(f"shard {shard_id} of {stream} is closed: only open shards can be split")
    low, high = shard.hash_range.start, shard.hash_range.end
    if at is None:
        new_start = (low + high + 1) // 2
    elif at.isdigit():
        new_start = int(at)
    else:
        fail(f"--at must be a decimal hash key, got {at!r}")
    if not low < new_start <= high:
        fail(
            f"--at must lie within {low + 1}..{high} (the hash range of {shard_id} minus its start)"
        )
    await retrying(
        lambda: kinesis.split_shard(
            **stream_ref(stream), ShardToSplit=shard_id, NewStartingHashKey=str(new_start)
        ),
        operation="SplitShard",
        stream=stream,
        shard_id=shard_id,
    )


async def _create_stream(kinesis: Any, params: dict[str, Any]) -> None:
    try:
        await kinesis.create_stream(**params)
    except ClientError as exc:
        # ResourceInUse is retryable elsewhere (a stream busy updating), but here it means the
        # name is taken: retrying cannot help.
        if exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
            raise
        name = params["StreamName"]
        raise InvalidArgumentError(
            f"stream {name} already exists",
            operation="CreateStream",
            code="ResourceInUseException",
            stream=name,
        ) from exc


def _find_shard(shards: list[ShardInfo], shard_id: str) -> ShardInfo:
    for shard in shards:
        if shard.shard_id == shard_id:
            return shard
    known = ", ".join(s.shard_id for s in shards if s.is_open)
    fail(f"no shard {shard_id} in this stream (open shards: {known})")


async def _list_streams(kinesis: Any) -> list[dict[str, Any]]:
    """Every stream as a summary (name, status, mode if the service gives them)."""
    streams: dict[str, dict[str, Any]] = {}
    params: dict[str, Any] = {}
    while True:
        page = await retrying(
            lambda p=params: kinesis.list_streams(**p),  # type: ignore[misc]
            operation="ListStreams",
        )
        before = len(streams)
        summaries = page.get("StreamSummaries") or [
            {"StreamName": name} for name in page.get("StreamNames", [])
        ]
        for summary in summaries:
            streams[summary["StreamName"]] = summary
        # A page adding nothing ends the listing too: some emulators repeat pages forever.
        if not page.get("HasMoreStreams") or len(streams) == before:
            break
        token = page.get("NextToken")
        params = {"NextToken": token} if token else {"ExclusiveStartStreamName": max(streams)}
    return [streams[name] for name in sorted(streams)]


def _mode_of(summary: dict[str, Any]) -> str:
    mode = summary.get("StreamModeDetails", {}).get("StreamMode", "PROVISIONED")
    return str(mode).lower().replace("_", "-")
