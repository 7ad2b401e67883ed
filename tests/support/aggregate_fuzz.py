"""Mutated KPL aggregates with valid MD5s, made fast from a seed (for the intake fuzz test).

Bodies are written by hand (tag bytes, varints), so the mutations do not depend on the
encoder under test and cost a few microseconds each. Three kinds, mixed:

- field mutations: a well-formed message with one field made odd (keys that are not hash keys,
  empty or over-long partition keys, indexes past the tables, missing fields, tags, no records);
- byte mutations: a well-formed body with bytes flipped, inserted, deleted, duplicated or cut;
- framing mutations (a few): a wrong digest, a body cut short, nothing but the magic.

Everything except the framing mutations carries the MD5 of its (mutated) body, so it gets
past the digest check and into the protobuf parser and the field checks.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator

from shardflow.aggregation import MAGIC

_ODD_HASH_KEYS = (
    b"",
    b"abc",
    b"-1",
    b" 12",
    b"12 ",
    b"+5",
    b"1_000",
    b"0x10",
    b"01",
    b"1e9",
    b"\xd9\xa3",  # ARABIC-INDIC DIGIT THREE: str.isdigit() says yes, Kinesis says no
    b"\xef\xbc\x91",  # FULLWIDTH DIGIT ONE
    str(2**128).encode(),
    str(2**200).encode(),
    b"9" * 40,
    b"\xff\xfe",  # not UTF-8
    b"1.5",
    b"NaN",
)
_ODD_PARTITION_KEYS = (b"", b"k" * 257, "\u00e9".encode() * 300, b"\xc3", b"\x00", b"\xed\xa0\x80")


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def varint_field(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def framed(body: bytes) -> bytes:
    return MAGIC + body + hashlib.md5(body).digest()


class AggregateFuzzer:
    """Makes mutated aggregates (the data of a Kinesis record) from ``seed``.

    Mutations start from a pool of ``pool`` well-formed messages made up front (making a fresh
    one each time would cost more than the code under test).
    """

    def __init__(self, seed: int, pool: int = 4096) -> None:
        self.rng = random.Random(seed)
        self._pool = [self._fresh_parts() for _ in range(pool)]
        self._bodies = [self._body(*parts) for parts in self._pool]
        self._kinds: list[Callable[[], bytes]] = [
            *([self._field_mutation] * 5),
            *([self._byte_mutation] * 4),
            self._framing_mutation,
        ]

    def __iter__(self) -> Iterator[bytes]:
        choose = self.rng.choice
        kinds = self._kinds
        while True:
            yield choose(kinds)()

    # --- well-formed parts -----------------------------------------------------------------

    def _partition_keys(self) -> list[bytes]:
        rng = self.rng
        return [f"key-{rng.randrange(1000)}".encode() for _ in range(rng.randint(1, 3))]

    def _hash_keys(self) -> list[bytes]:
        rng = self.rng
        return [str(rng.randrange(2**128)).encode() for _ in range(rng.randint(0, 2))]

    def _user_record(self, pk_count: int, ehk_count: int) -> bytes:
        rng = self.rng
        body = varint_field(1, rng.randrange(pk_count))
        if ehk_count and rng.random() < 0.5:
            body += varint_field(2, rng.randrange(ehk_count))
        return body + field(3, rng.randbytes(rng.randint(0, 12)))

    def _body(self, pks: list[bytes], ehks: list[bytes], records: list[bytes]) -> bytes:
        return (
            b"".join(field(1, pk) for pk in pks)
            + b"".join(field(2, ehk) for ehk in ehks)
            + b"".join(field(3, record) for record in records)
        )

    def _valid_parts(self) -> tuple[list[bytes], list[bytes], list[bytes]]:
        pks, ehks, records = self.rng.choice(self._pool)
        return list(pks), list(ehks), list(records)

    def _fresh_parts(self) -> tuple[list[bytes], list[bytes], list[bytes]]:
        pks, ehks = self._partition_keys(), self._hash_keys()
        records = [self._user_record(len(pks), len(ehks)) for _ in range(self.rng.randint(1, 4))]
        return pks, ehks, records

    # --- mutations -------------------------------------------------------------------------

    def _field_mutation(self) -> bytes:
        rng = self.rng
        pks, ehks, records = self._valid_parts()
        what = rng.randrange(9)
        if what == 0:
            ehks.append(rng.choice(_ODD_HASH_KEYS))
            records.append(varint_field(1, 0) + varint_field(2, len(ehks) - 1) + field(3, b"x"))
        elif what == 1:
            pks[rng.randrange(len(pks))] = rng.choice(_ODD_PARTITION_KEYS)
        elif what == 2:
            index = rng.choice((len(pks), len(pks) + 1, 2**63, 2**64 - 1))
            records.append(varint_field(1, index) + field(3, b"x"))
        elif what == 3:
            index = rng.choice((len(ehks), 5, 2**64 - 1))
            records.append(varint_field(1, 0) + varint_field(2, index) + field(3, b"x"))
        elif what == 4:
            records.append(rng.choice((varint_field(1, 0), field(3, b"x"), b"")))
        elif what == 5:
            tag = rng.choice((field(1, b"k"), field(2, b"v"), field(1, b"\xff"), b""))
            records[-1] += field(4, tag)
        elif what == 6:
            records = []
        elif what == 7:
            pks = []
        else:
            # An unknown field, or a known one with the wrong wire type.
            records[0] += rng.choice((varint_field(9, 7), varint_field(3, 1), field(1, b"\x01")))
        return framed(self._body(pks, ehks, records))

    def _byte_mutation(self) -> bytes:
        rng = self.rng
        body = bytearray(rng.choice(self._bodies))
        for _ in range(rng.randint(1, 3)):
            if not body:
                body.append(rng.randrange(256))
                continue
            at = rng.randrange(len(body))
            what = rng.randrange(5)
            if what == 0:
                body[at] ^= 1 << rng.randrange(8)
            elif what == 1:
                body[at] = rng.choice((0x00, 0x7F, 0x80, 0xFF, rng.randrange(256)))
            elif what == 2:
                body.insert(at, rng.randrange(256))
            elif what == 3:
                del body[at : at + rng.randint(1, 4)]
            else:
                end = min(len(body), at + rng.randint(1, 8))
                body[at:at] = body[at:end]
        return framed(bytes(body))

    def _framing_mutation(self) -> bytes:
        rng = self.rng
        data = framed(rng.choice(self._bodies))
        what = rng.randrange(3)
        if what == 0:
            return data[:-1] + bytes([data[-1] ^ 1])
        if what == 1:
            return data[: rng.randrange(len(MAGIC), len(data))]
        return MAGIC + rng.randbytes(rng.randrange(0, 17))
