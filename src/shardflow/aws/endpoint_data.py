"""botocore's endpoint data, kept only for the services shardflow's sessions make clients of.

A botocore session loads ``endpoints.json`` (every AWS service in every partition) the first
time it makes a client, for its legacy endpoint resolver, and keeps it for good: 6.7 MiB of
Python objects (tracemalloc, botocore 1.43, Python 3.11) in every shardflow process, of which
the services below are a few hundred KiB. :func:`trim_endpoint_data` makes a session's resolver
from the same file with every partition's other services left out; partitions, regions and
their defaults stay whole. Endpoints themselves come from each service's rule set (loaded per
client, untouched); for the services kept the resolver answers as botocore's own (a unit test
compares every region of every partition), and a client of another service is still made (its
endpoint from its rule set; only the legacy data is missing for it).
"""

from __future__ import annotations

import logging
from typing import Any, Final

from botocore.regions import EndpointResolver

log = logging.getLogger(__name__)

ENDPOINT_PREFIXES: Final = frozenset(
    {
        "kinesis",
        "dynamodb",
        "streams.dynamodb",  # DynamoDB Streams (lease pick-up)
        "monitoring",  # CloudWatch
        "s3",
        "sts",  # assumed roles
        "portal.sso",  # the SSO credential provider's clients
        "oidc",
        "sso",
    }
)
"""The services kept, by the ``endpointPrefix`` endpoints.json files them under."""

_CACHE_KEY: Final = ("load_data_with_path", "endpoints")
"""Where botocore's Loader caches the file (``instance_cache``: method name, then arguments)."""


def trimmed(endpoints: dict[str, Any], keep: frozenset[str] = ENDPOINT_PREFIXES) -> dict[str, Any]:
    """``endpoints`` (the parsed endpoints.json) with only the services in ``keep``."""
    return {
        **endpoints,
        "partitions": [
            {
                **partition,
                "services": {
                    name: service
                    for name, service in partition.get("services", {}).items()
                    if name in keep
                },
            }
            for partition in endpoints.get("partitions", ())
        ],
    }


def trim_endpoint_data(session: Any) -> bool:
    """Have ``session`` (a botocore or aiobotocore session) build its endpoint resolver from
    the trimmed data, when it first needs one. False (nothing changed) if this botocore keeps
    its components otherwise than this module knows."""
    components = getattr(session, "_internal_components", None)
    if components is None or not hasattr(components, "lazy_register_component"):
        return False

    def create_resolver() -> EndpointResolver:
        loader = session.get_component("data_loader")
        endpoints, path = loader.load_data_with_path("endpoints")
        # The loader would keep the whole file in its cache: only the trimmed copy stays.
        cache = getattr(loader, "_cache", None)
        if isinstance(cache, dict):
            cache.pop(_CACHE_KEY, None)
        return EndpointResolver(trimmed(endpoints), uses_builtin_data=loader.is_builtin_path(path))

    components.lazy_register_component("endpoint_resolver", create_resolver)
    return True
