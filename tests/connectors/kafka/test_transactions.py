"""The Kafka sink's transactional ids, pool and restore plan; the EndTxn wire format (no broker)."""

from __future__ import annotations

import struct

import pytest

from streamsnap.connectors.kafka import protocol as wire
from streamsnap.connectors.kafka import transactions as txns
from streamsnap.connectors.kafka.source import Kafka, initial_offset, owner_of


def test_ids_are_stable_per_job_uid_subtask_and_slot():
    prefix = txns.default_prefix("0123456789abcdef0123", "out")
    assert prefix == "streamsnap-0123456789abcdef-out"
    assert txns.pool_ids(prefix, 1, 3) == [f"{prefix}-1-0", f"{prefix}-1-1", f"{prefix}-1-2"]


def test_the_pool_cycles_and_refuses_a_slot_still_waiting_for_its_commit():
    pool = txns.TransactionPool("p", 0, 2)
    slot0, tid0 = pool.take()
    pool.pre_committed(slot0, txns.txn_committable(tid0, 7, 0, 1, 0))
    slot1, tid1 = pool.take()
    pool.pre_committed(slot1, txns.txn_committable(tid1, 8, 0, 2, 0))
    assert [c["checkpoint"] for _, c in pool.due(1)] == [1]
    assert not pool.next_is_free()
    with pytest.raises(txns.TransactionPoolExhausted, match="checkpoints \\[1, 2\\].*transaction_pool_size"):
        pool.take()
    pool.committed(slot0)
    assert pool.next_is_free()
    assert pool.take() == (0, "p-0-0")
    marker, *pending = pool.committables(parallelism=3)
    assert marker == {"kind": "ids", "prefix": "p", "subtask": 0, "parallelism": 3, "pool": 2}
    assert [c["id"] for c in pending] == ["p-0-1"]


def test_restore_commits_the_owned_pre_committed_transactions_then_fences_every_old_id():
    state = [txns.ids_committable("old", s, 4, 2) for s in range(4)]
    state += [txns.txn_committable("old-3-1", 30, 2, 9, 3), txns.txn_committable("old-1-0", 10, 1, 8, 1),
              txns.txn_committable("old-0-0", 5, 0, 9, 0)]
    plan = txns.recovery_plan(state, subtask=1, parallelism=2, prefix="new", pool_size=3)
    assert plan.prefix == "old"                      # the predecessor's ids go on being used
    assert [c["id"] for c in plan.commit] == ["old-1-0", "old-3-1"]   # oldest checkpoint first
    assert plan.abort == ["old-1-0", "old-1-1", "old-3-0", "old-3-1", "old-1-2"]
    fresh = txns.recovery_plan([], subtask=0, parallelism=1, prefix="new", pool_size=2)
    assert fresh == txns.RecoveryPlan("new", [], ["new-0-0", "new-0-1"])


def test_the_producer_id_comes_from_librdkafkas_eos_log_line():
    line = "GETPID [rdkafka#producer-2] [thrd:main]: Acquired PID{Id:1042,Epoch:3}"
    assert txns.parse_producer_id(line) == (1042, 3)
    assert txns.parse_producer_id("TXNSTATE Transaction state change Init -> WaitPID") is None


def test_end_txn_and_find_coordinator_on_the_wire():
    request = wire.encode_end_txn("tx-1", 1042, 3, True, correlation_id=5)
    size, api, version, correlation = struct.unpack_from(">ihhi", request)
    assert (size, api, version, correlation) == (len(request) - 4, wire.END_TXN, 1, 5)
    assert request.endswith(struct.pack(">h", 4) + b"tx-1" + struct.pack(">qhb", 1042, 3, 1))
    response = struct.pack(">iih", 6, 0, 0) + struct.pack(">h", -1) + struct.pack(">i", 111) + \
        struct.pack(">h", 9) + b"127.0.0.1" + struct.pack(">i", 9092)
    assert wire.decode_find_coordinator(response, 6) == (0, wire.Coordinator(111, "127.0.0.1", 9092))
    with pytest.raises(wire.KafkaProtocolError, match="correlation id"):
        wire.decode_end_txn(struct.pack(">iih", 8, 0, 0), 6)
    assert wire.end_txn_outcome(0, True, "t") is wire.EndTxnOutcome.COMMITTED
    assert wire.end_txn_outcome(90, True, "t") is wire.EndTxnOutcome.FENCED
    assert wire.end_txn_outcome(51, True, "t") is None           # CONCURRENT_TRANSACTIONS: retry
    with pytest.raises(wire.KafkaProtocolError, match="'t' failed with Kafka error 87"):
        wire.end_txn_outcome(87, True, "t")
    assert wire.parse_bootstrap("a:1, PLAINTEXT://b:2,c") == [("a", 1), ("b", 2), ("c", 9092)]


def test_source_splits_offsets_and_the_owner_of_discovered_partitions():
    assert initial_offset("latest", "t", 0) == -1
    assert initial_offset({1: 40}, "t", 1) == 40 and initial_offset({("t", 0): 7}, "t", 0) == 7
    assert initial_offset({1: 40}, "t", 0) == -2                 # unnamed partitions: earliest
    owners = {owner_of("t", p, 3) for p in range(6)}
    assert owners == {0, 1, 2} and owner_of("t", 4, 3) == owner_of("t", 4, 3)
    with pytest.raises(Exception, match="exactly one of topics"):
        Kafka("b:1", ["t"], pattern="t.*")
    with pytest.raises(Exception, match="starting_offsets must be one of"):
        Kafka("b:1", ["t"], starting_offsets="newest")
