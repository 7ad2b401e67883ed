"""The environment variables that point an AWS SDK (or shardflow) at the local stack.

Rules, so a user can predict them:

- Each service's calls go where that service is served, by the service-specific variables
  every current AWS SDK honours (boto3, aiobotocore, the AWS CLI v2):
  ``AWS_ENDPOINT_URL_KINESIS`` names kinesis-local when it runs, else kinesalite, else moto;
  ``AWS_ENDPOINT_URL_DYNAMODB``, ``_DYNAMODB_STREAMS``, ``_CLOUDWATCH`` and ``_S3`` name moto.
- ``AWS_ENDPOINT_URL`` is moto's server when it runs: the fallback for every other service
  and for SDKs that know only the global variable.
- ``SHARDFLOW_<SERVER>_URL`` names each running server's endpoint (e.g. kinesis-local next to
  moto, for resharding tests).
- Dummy credentials (``testing``) and region ``us-east-1`` are added only when the current
  environment has none: the emulators accept any signature, and existing settings win.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

DUMMY_CREDENTIAL = "testing"
DEFAULT_REGION = "us-east-1"
#: Which server takes the SDK's Kinesis calls, best first.
_KINESIS_PREFERENCE = ("kinesis-local", "kinesalite", "moto")
#: The services only moto serves, by the suffix of their ``AWS_ENDPOINT_URL_*`` variable.
_MOTO_SERVICES = ("DYNAMODB", "DYNAMODB_STREAMS", "CLOUDWATCH", "S3")


def url_variable(server_name: str) -> str:
    """``SHARDFLOW_KINESIS_LOCAL_URL`` for ``kinesis-local``, and so on."""
    return f"SHARDFLOW_{server_name.upper().replace('-', '_')}_URL"


def client_environment(endpoints: Mapping[str, str], current: Mapping[str, str]) -> dict[str, str]:
    """Variables to export so SDKs reach the servers in ``endpoints`` (server name → URL).

    ``current`` is the environment the variables will be added to (usually ``os.environ``).
    """
    env: dict[str, str] = {}
    if "moto" in endpoints:
        env["AWS_ENDPOINT_URL"] = endpoints["moto"]
    kinesis = next((name for name in _KINESIS_PREFERENCE if name in endpoints), None)
    if kinesis is not None:
        env["AWS_ENDPOINT_URL_KINESIS"] = endpoints[kinesis]
    if "moto" in endpoints:
        for service in _MOTO_SERVICES:
            env[f"AWS_ENDPOINT_URL_{service}"] = endpoints["moto"]
    for name, url in endpoints.items():
        env[url_variable(name)] = url
    if not current.get("AWS_ACCESS_KEY_ID"):
        env["AWS_ACCESS_KEY_ID"] = DUMMY_CREDENTIAL
        env["AWS_SECRET_ACCESS_KEY"] = DUMMY_CREDENTIAL
    if not (current.get("AWS_REGION") or current.get("AWS_DEFAULT_REGION")):
        env["AWS_DEFAULT_REGION"] = DEFAULT_REGION
    return env


def export_lines(env: Mapping[str, str]) -> list[str]:
    """``export NAME=value`` lines for a POSIX shell, values quoted where needed."""
    return [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
