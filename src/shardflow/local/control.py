"""Probing and stopping detached servers known only from their :class:`ServerRecord`."""

from __future__ import annotations

from enum import StrEnum

from shardflow.local.process import is_alive, runs_command, terminate
from shardflow.local.readiness import answers_http
from shardflow.local.state import ServerRecord


class ServerState(StrEnum):
    """What a recorded server is doing now."""

    READY = "ready"
    NOT_ANSWERING = "running, not answering"
    STOPPED = "stopped"
    #: The PID runs some other program now: the server ended and its PID was reused.
    PID_REUSED = "stopped (pid reused)"


def server_state(record: ServerRecord) -> ServerState:
    """Probe the recorded server: is its process still the server, and does it answer HTTP?"""
    if not runs_command(record.pid, record.command):
        return ServerState.PID_REUSED if is_alive(record.pid) else ServerState.STOPPED
    return ServerState.READY if answers_http(record.port) else ServerState.NOT_ANSWERING


class StopOutcome(StrEnum):
    """What :func:`stop_recorded` did."""

    STOPPED = "stopped"
    ALREADY_STOPPED = "was not running"
    #: The PID runs some other program now; it was left alone.
    PID_REUSED = "was not running (pid reused by another program, left alone)"


def stop_recorded(record: ServerRecord) -> StopOutcome:
    """Stop the recorded server (SIGTERM, then SIGKILL) if its PID still runs it."""
    if not runs_command(record.pid, record.command):
        return StopOutcome.PID_REUSED if is_alive(record.pid) else StopOutcome.ALREADY_STOPPED
    terminate(record.pid, timeout=record.stop_timeout)
    return StopOutcome.STOPPED
