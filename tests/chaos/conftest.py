"""Chaos tests run against the same emulators as the integration tests: reuse their fixtures."""

from integration.conftest import moto_server, moto_url, stream_name

__all__ = ["moto_server", "moto_url", "stream_name"]
