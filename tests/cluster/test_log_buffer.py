"""The JobMaster's buffer of task log records for an attached client (cluster/log_buffer.py)."""

from __future__ import annotations

from streamsnap.cluster.log_buffer import LogBuffer


def batch(*messages: str) -> dict:
    return {"type": "logs", "operator": "op", "subtask": 0, "records": [{"message": m} for m in messages]}


def test_a_client_reads_each_batch_once_with_its_cursor_and_from_the_start_after_a_failover():
    buffer = LogBuffer(epoch=3)
    assert buffer.since(None, 0) == {"epoch": 3, "next": 0, "missed_batches": 0, "batches": []}
    buffer.append(batch("a"))
    buffer.append(batch("b", "c"))
    first = buffer.since(None, 0)
    assert [b["records"] for b in first["batches"]] == [[{"message": "a"}], [{"message": "b"}, {"message": "c"}]]
    assert buffer.since(first["epoch"], first["next"])["batches"] == []
    buffer.append(batch("d"))
    assert [b["records"][0]["message"] for b in buffer.since(3, first["next"])["batches"]] == ["d"]
    # A cursor of an earlier JobMaster's epoch reads this one from its start.
    assert len(buffer.since(2, 17)["batches"]) == 3


def test_the_oldest_batches_go_when_full_and_the_reply_counts_what_a_slow_client_missed():
    buffer = LogBuffer(epoch=0, limit=3)
    for m in ("a", "b", "c", "d", "e"):
        buffer.append(batch(m))
    reply = buffer.since(0, 0)
    assert [b["records"][0]["message"] for b in reply["batches"]] == ["c", "d", "e"]
    assert (reply["missed_batches"], reply["next"]) == (2, 5)
    assert buffer.since(0, 3)["missed_batches"] == 0
    big = LogBuffer(epoch=0, limit=1)
    big.append(batch("x", "y", "z"))              # one batch over the limit is still kept
    assert len(big.since(0, 0)["batches"]) == 1
