"""The errors of ``shardflow multilang``: a properties file it cannot honour, a child process
that breaks the protocol, exits or stops answering.

::

    ShardflowError
     ├── ConfigurationError
     │    └── PropertiesError          a key or value of the properties file (named, with its line)
     └── ProcessorError               a shard's record processor (the child process)
          ├── ProcessorStartError      its executable could not be started
          ├── ProcessorExitedError     it exited (or closed its stdout) while it had work
          ├── ProcessorTimeoutError    it did not answer within the response timeout
          └── ProtocolError            it answered what the protocol does not allow
"""

from __future__ import annotations

from shardflow.errors import ConfigurationError, ShardflowError


class PropertiesError(ConfigurationError):
    """A MultiLangDaemon properties file that cannot be run as written: ``key`` names the
    property (None: the file as a whole), ``line`` where it is (1-based; None: not from a line)."""

    def __init__(self, message: str, *, key: str | None = None, line: int | None = None) -> None:
        self.key = key
        self.line = line
        where = ""
        if key is not None:
            where = f"property {key!r}"
            if line is not None:
                where += f" (line {line})"
            where += ": "
        super().__init__(f"{where}{message}")


class ProcessorError(ShardflowError):
    """A shard's record processor (the child process) failed; ``shard_id`` says whose."""

    def __init__(self, message: str, *, shard_id: str) -> None:
        self.shard_id = shard_id
        super().__init__(f"shard {shard_id}: {message}")


class ProcessorStartError(ProcessorError):
    """The child's executable could not be started (not found, not executable)."""


class ProcessorExitedError(ProcessorError):
    """The child exited, or closed its stdout, while the daemon waited for it;
    ``returncode`` is its exit status (None: still running with stdout closed)."""

    def __init__(self, message: str, *, shard_id: str, returncode: int | None) -> None:
        self.returncode = returncode
        super().__init__(message, shard_id=shard_id)


class ProcessorTimeoutError(ProcessorError):
    """The child sent nothing within the response timeout while the daemon waited for it."""

    def __init__(self, message: str, *, shard_id: str, waited: float) -> None:
        self.waited = waited
        super().__init__(message, shard_id=shard_id)


class ProtocolError(ProcessorError):
    """The child answered out of protocol (a status for another action, say)."""
