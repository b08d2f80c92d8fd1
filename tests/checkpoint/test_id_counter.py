"""Checkpoint ids never repeat and never go backwards, also across restarts."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings, strategies as st

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.id_counter import CheckpointIdCounter


def test_in_memory_sequence():
    counter = CheckpointIdCounter()
    assert counter.current == 1
    assert [counter.get_and_increment() for _ in range(3)] == [1, 2, 3]
    assert counter.current == 4


def test_set_count_never_moves_backwards():
    counter = CheckpointIdCounter(start=10)
    counter.set_count(5)
    assert counter.current == 10
    counter.set_count(21)
    assert counter.get_and_increment() == 21


def test_start_must_be_positive():
    with pytest.raises(ValueError):
        CheckpointIdCounter(start=0)


def test_persisted_before_an_id_is_handed_out(tmp_path):
    path = str(tmp_path / "job" / "_checkpoint_id")
    counter = CheckpointIdCounter(path)
    assert counter.get_and_increment() == 1
    # A driver dying right now must not hand out 1 again.
    assert CheckpointIdCounter(path).current == 2


def test_continues_across_restarts_and_after_restore(tmp_path):
    path = str(tmp_path / "_checkpoint_id")
    first = CheckpointIdCounter(path)
    for _ in range(4):
        first.get_and_increment()
    second = CheckpointIdCounter(path)
    assert second.get_and_increment() == 5
    second.set_count(100)  # restored checkpoint 99
    assert CheckpointIdCounter(path).get_and_increment() == 100
    assert CheckpointIdCounter(path, start=500).current == 500  # start is a floor


def test_unreadable_file_warns_and_starts_over(tmp_path, caplog):
    path = tmp_path / "_checkpoint_id"
    path.write_bytes(b"\x00garbage")
    with caplog.at_level(logging.WARNING):
        counter = CheckpointIdCounter(str(path))
    assert counter.current == 1
    assert "unreadable" in caplog.text


def test_writes_atomically(tmp_path, monkeypatch):
    calls = []
    real = filesystem.write_atomic
    monkeypatch.setattr(filesystem, "write_atomic", lambda url, data: (calls.append(url), real(url, data)))
    CheckpointIdCounter(str(tmp_path / "c")).get_and_increment()
    assert calls == [filesystem.normalize(str(tmp_path / "c"))]


@settings(deadline=None)  # each step fsyncs the counter file: slow on a loaded disk, not wrong
@given(st.lists(st.one_of(st.just("next"), st.just("restart"), st.integers(0, 200)), max_size=40))
def test_ids_strictly_increase_under_any_schedule(tmp_path_factory, operations):
    path = str(tmp_path_factory.mktemp("counter") / "_checkpoint_id")
    counter = CheckpointIdCounter(path)
    handed_out = []
    for op in operations:
        if op == "next":
            handed_out.append(counter.get_and_increment())
        elif op == "restart":
            counter = CheckpointIdCounter(path)
        else:
            counter.set_count(op)
    assert handed_out == sorted(set(handed_out))
