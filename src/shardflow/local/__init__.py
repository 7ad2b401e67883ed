"""The embedded local stack: AWS emulators on 127.0.0.1 for the demo, tests and benchmarks.

:class:`LocalStack` runs any of moto's server (Kinesis, DynamoDB, DynamoDB Streams,
CloudWatch), kinesis-local and kinesalite; each server class also works on its own, as does
:class:`DynaliteServer` (a DynamoDB for benchmarks whose lease table outruns moto's).
"""

from shardflow.local.environment import client_environment, export_lines
from shardflow.local.server import LocalServer
from shardflow.local.servers import (
    DynaliteServer,
    KinesaliteServer,
    KinesisLocalServer,
    MotoServer,
)
from shardflow.local.stack import LocalStack

__all__ = [
    "DynaliteServer",
    "KinesaliteServer",
    "KinesisLocalServer",
    "LocalServer",
    "LocalStack",
    "MotoServer",
    "client_environment",
    "export_lines",
]
