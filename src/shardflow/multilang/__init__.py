"""``shardflow multilang``: record processors written for the KCL's MultiLangDaemon, unchanged.

The daemon reads the MultiLangDaemon's properties file (:mod:`.properties`, :mod:`.config`),
runs one child process per shard lease (:mod:`.child`) and speaks the line-delimited JSON
protocol to it byte for byte as the KCL does (:mod:`.messages`), one shard at a time
(:mod:`.shard`), on shardflow's consumer (:mod:`.daemon`). Errors: :mod:`.errors`.
"""

from shardflow.multilang.config import MultiLangConfig, PropertyNote, config_from, load_config
from shardflow.multilang.daemon import MultiLangDaemon
from shardflow.multilang.errors import (
    ProcessorError,
    ProcessorExitedError,
    ProcessorStartError,
    ProcessorTimeoutError,
    PropertiesError,
    ProtocolError,
)
from shardflow.multilang.properties import Property, parse_properties, read_properties

__all__ = [
    "MultiLangConfig",
    "MultiLangDaemon",
    "ProcessorError",
    "ProcessorExitedError",
    "ProcessorStartError",
    "ProcessorTimeoutError",
    "PropertiesError",
    "Property",
    "PropertyNote",
    "ProtocolError",
    "config_from",
    "load_config",
    "parse_properties",
    "read_properties",
]
