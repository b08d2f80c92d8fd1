"""The Generator source's rate limiting: paced steps, not a trickle of tiny batches."""

import pytest

from streamsnap.connectors import sources
from streamsnap.connectors.sources import Generator, GeneratorReader


class FakeTime:
    def __init__(self):
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(sources, "time", fake)
    return fake


def reader_for(source: Generator) -> GeneratorReader:
    reader = GeneratorReader(source, None)
    reader.assign_splits(source.splits(1))
    reader.open()
    return reader


def test_a_rate_limited_generator_emits_in_paced_steps(clock):
    reader = reader_for(Generator(lambda i: {"i": i}, rate=100_000, batch_size=1024))
    step = int(100_000 * sources.PACE)           # 100 rows: one PACE of the rate
    clock.now += 0.5 * sources.PACE              # half a step's worth is due: wait for the rest
    assert reader.poll() is None
    assert reader.next_available_in() == pytest.approx(0.5 * sources.PACE)
    clock.now += 0.5 * sources.PACE
    assert [r["i"] for r in reader.poll()] == list(range(step))
    clock.now += 0.05                            # a backlog is caught up in full batches
    assert len(reader.poll()) == 1024


def test_the_last_rows_of_a_bounded_generator_do_not_wait_for_a_full_step(clock):
    reader = reader_for(Generator(lambda i: {"i": i}, count=130, rate=100_000))
    clock.now += sources.PACE
    assert len(reader.poll()) == 100
    clock.now += 0.3 * sources.PACE              # 30 rows due, 30 left: they go now
    assert [r["i"] for r in reader.poll()] == list(range(100, 130))
    assert reader.is_finished()


def test_an_unlimited_generator_emits_full_batches_at_once(clock):
    reader = reader_for(Generator(lambda i: {"i": i}, batch_size=64))
    assert len(reader.poll()) == 64
    assert reader.next_available_in() == 0.0


def test_a_held_back_generator_catches_up_by_at_most_max_burst_of_its_rows(clock):
    """A token bucket, not an unbounded debt: after a 5 s stall (a slow start, backpressure)
    a 150 rows/s subtask emits 1 s of rows at once, then keeps its pace from there."""
    reader = reader_for(Generator(lambda i: {"i": i}, rate=150, batch_size=1024))
    clock.now += 5.0
    assert len(reader.poll()) == int(150 * sources.MAX_BURST)
    assert reader.poll() is None
    assert reader.next_available_in() == pytest.approx(1 / 150)
    clock.now += 1.01 / 150
    assert len(reader.poll()) == 1
