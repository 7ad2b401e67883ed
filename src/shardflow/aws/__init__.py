"""Everything shardflow says to AWS goes through here: clients, error classes, backoff."""

from shardflow.aws.backoff import DEFAULT_BACKOFF, retrying
from shardflow.aws.classify import classify, error_class_for_code
from shardflow.aws.clients import ClientFactory, OpenClients
from shardflow.aws.redaction import redact, register_secret
from shardflow.aws.settings import AssumeRole, AwsSettings
from shardflow.backoff import Backoff

__all__ = [
    "DEFAULT_BACKOFF",
    "AssumeRole",
    "AwsSettings",
    "Backoff",
    "ClientFactory",
    "OpenClients",
    "classify",
    "error_class_for_code",
    "redact",
    "register_secret",
    "retrying",
]
