"""What the fault proxy injects, when, and the record of what it did.

Faults are plain values; a :class:`RuleBook` holds the active rules, decides (thread-safely,
with a seeded random generator) which one a request meets, and keeps the injection log.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

THROTTLED: Literal["ProvisionedThroughputExceededException"] = (
    "ProvisionedThroughputExceededException"
)
INTERNAL_FAILURE: Literal["InternalFailure"] = "InternalFailure"


@dataclass(frozen=True, slots=True)
class PartialFailure:
    """Fail some entries of a PutRecords request; the failed entries are not written.

    With ``indices`` exactly those positions fail (positions past the end are ignored);
    otherwise ``round(fraction * n)`` randomly chosen entries fail, at least one.
    ``code`` is ``ProvisionedThroughputExceededException`` or ``InternalFailure``.
    """

    fraction: float = 0.5
    indices: frozenset[int] | None = None
    code: str = THROTTLED

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"fraction must be within (0, 1], got {self.fraction}")


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """Answer with a genuine AWS JSON error instead of (or after) forwarding the request.

    ``status`` and ``message`` default to what the service sends for ``code``. With
    ``after_forwarding`` the request reaches the server (a write happens) but the client sees
    the error: the ambiguous outcome of a timeout.
    """

    code: str = THROTTLED
    status: int | None = None
    message: str | None = None
    after_forwarding: bool = False


@dataclass(frozen=True, slots=True)
class Delay:
    """Wait ``seconds`` before answering, to run into client read timeouts.

    Before forwarding (the default), a request whose client hung up during the wait is not
    forwarded at all: a timeout that wrote nothing. With ``after_forwarding`` the request is
    forwarded at once and the answer held back: a timeout after the write happened.
    """

    seconds: float
    after_forwarding: bool = False


@dataclass(frozen=True, slots=True)
class Drop:
    """Close the connection without answering, before or after forwarding the request.

    ``reset`` aborts the connection (TCP RST) instead of closing it in an orderly way.
    """

    after_forwarding: bool = False
    reset: bool = False


Fault = PartialFailure | ErrorResponse | Delay | Drop
FaultKind = Literal["partial_failure", "error", "delay", "drop"]

_KINDS: dict[type[Fault], FaultKind] = {
    PartialFailure: "partial_failure",
    ErrorResponse: "error",
    Delay: "delay",
    Drop: "drop",
}


def kind_of(fault: Fault) -> FaultKind:
    """The short name of a fault's kind, as used in :class:`Injection`."""
    return _KINDS[type(fault)]


@dataclass(frozen=True, slots=True)
class Rule:
    """A fault and the requests it applies to.

    A request matches when its ``X-Amz-Target`` names ``service`` (the prefix before ``_``,
    e.g. ``Kinesis`` or ``DynamoDB``; ``CloudWatch`` for its ``GraniteServiceVersion20100801``;
    None: any) and ``operation`` (None: any), and its body
    names ``stream`` (None: any). Of the matching requests the first ``skip`` pass untouched,
    then each is hit with ``probability``, at most ``times`` times in all (None: no limit).
    """

    fault: Fault
    operation: str | None = None
    service: str | None = "Kinesis"
    stream: str | None = None
    times: int | None = None
    probability: float = 1.0
    skip: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.fault, PartialFailure) and self.operation != "PutRecords":
            raise ValueError("PartialFailure applies to PutRecords only")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"probability must be within [0, 1], got {self.probability}")
        if self.times is not None and self.times < 0:
            raise ValueError("times must not be negative")


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What the rules look at in a request."""

    service: str
    operation: str
    stream: str | None = None
    entry_count: int = 0  # PutRecords entries


@dataclass(frozen=True, slots=True)
class Decision:
    """The rule a request met; ``failed_entries`` are the PutRecords positions to fail."""

    rule_id: int
    fault: Fault
    entries: int = 0
    failed_entries: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Injection:
    """One fault the proxy really injected.

    ``forwarded`` tells whether the request (for a partial failure: what was left of it)
    reached the upstream server; ``client_gone`` that the client hung up during a delay.
    ``entries`` is the number of records in a PutRecords request (0 for other operations).
    """

    rule_id: int
    kind: FaultKind
    fault: Fault
    operation: str
    stream: str | None
    forwarded: bool
    entries: int = 0
    failed_entries: tuple[int, ...] = ()
    client_gone: bool = False
    at: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _RuleState:
    rule: Rule
    matched: int = 0
    injected: int = 0


class RuleBook:
    """The active rules and the injection log, safe to use from any thread."""

    def __init__(self, seed: int | None = None) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._rules: dict[int, _RuleState] = {}
        self._next_id = 1
        self._log: list[Injection] = []

    def add(self, rule: Rule) -> int:
        with self._lock:
            rule_id = self._next_id
            self._next_id += 1
            self._rules[rule_id] = _RuleState(rule)
            return rule_id

    def remove(self, rule_id: int) -> None:
        with self._lock:
            self._rules.pop(rule_id, None)

    def clear(self) -> None:
        """Remove every rule (the log is kept)."""
        with self._lock:
            self._rules.clear()

    def injected_count(self, rule_id: int) -> int:
        with self._lock:
            state = self._rules.get(rule_id)
            if state is not None:
                return state.injected
            return sum(1 for i in self._log if i.rule_id == rule_id)

    def choose(self, request: RequestInfo) -> Decision | None:
        """The fault for ``request`` (the first rule that matches and fires), if any."""
        with self._lock:
            for rule_id, state in self._rules.items():
                rule = state.rule
                if not _matches(rule, request):
                    continue
                state.matched += 1
                if state.matched <= rule.skip:
                    continue
                if rule.times is not None and state.injected >= rule.times:
                    continue
                if rule.probability < 1.0 and self._rng.random() >= rule.probability:
                    continue
                state.injected += 1
                failed: tuple[int, ...] = ()
                if isinstance(rule.fault, PartialFailure):
                    failed = self._pick_entries(rule.fault, request.entry_count)
                return Decision(rule_id, rule.fault, request.entry_count, failed)
        return None

    def record(self, injection: Injection) -> None:
        with self._lock:
            self._log.append(injection)

    def log(self) -> list[Injection]:
        with self._lock:
            return list(self._log)

    def _pick_entries(self, fault: PartialFailure, count: int) -> tuple[int, ...]:
        if fault.indices is not None:
            return tuple(sorted(i for i in fault.indices if 0 <= i < count))
        if count == 0:
            return ()
        how_many = min(count, max(1, round(fault.fraction * count)))
        return tuple(sorted(self._rng.sample(range(count), how_many)))


def _matches(rule: Rule, request: RequestInfo) -> bool:
    return (
        (rule.service is None or rule.service == request.service)
        and (rule.operation is None or rule.operation == request.operation)
        and (rule.stream is None or rule.stream == request.stream)
    )
