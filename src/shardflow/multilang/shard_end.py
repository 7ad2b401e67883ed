"""Whether a shard whose records stopped coming has ended, or was only let go.

When a session's batches end and the lease is neither lost nor given up by a stop, the shard
either reached its end (the processor gets ``shardEnded`` and must checkpoint) or the lease
is being handed to another worker (``shutdownRequested``). The consumer's public API does not
say which, so Kinesis is asked: a shard has ended when nothing follows the last record
delivered (or the session's start) and no next iterator is given, which Kinesis answers only
for a closed shard read to its end. A sub-record with more of its aggregate to come is not the
end. Two calls (GetShardIterator, GetRecords with Limit 1), at the end of a session only.
"""

from __future__ import annotations

from typing import Any

from shardflow.consumer import ConsumedRecord, ShardSession
from shardflow.records import AT_TIMESTAMP, LATEST, SHARD_END, TRIM_HORIZON


async def reached_shard_end(
    kinesis: Any, session: ShardSession, after: ConsumedRecord[Any] | None
) -> bool:
    """Whether ``session``'s shard has no record after ``after`` (None: after the checkpoint
    the session started from) and is closed."""
    params: dict[str, str]
    if after is not None:
        if after.sub_sequence_number < after.last_sub_sequence_number:
            return False
        params = {
            "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
            "StartingSequenceNumber": after.sequence_number,
        }
    else:
        start = session.checkpointer.last_written
        sequence = TRIM_HORIZON if start is None else start.sequence_number
        if sequence == SHARD_END:
            return True
        if sequence in (TRIM_HORIZON, AT_TIMESTAMP):
            params = {"ShardIteratorType": TRIM_HORIZON}
        elif sequence == LATEST:
            params = {"ShardIteratorType": LATEST}
        else:
            params = {
                "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                "StartingSequenceNumber": sequence,
            }
    stream = session.stream
    where = {"StreamARN": stream} if stream.startswith("arn:") else {"StreamName": stream}
    answer = await kinesis.get_shard_iterator(**where, ShardId=session.shard_id, **params)
    page = await kinesis.get_records(ShardIterator=answer["ShardIterator"], Limit=1)
    return not page.get("Records") and not page.get("NextShardIterator")
