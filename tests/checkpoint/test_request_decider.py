"""The request decider: run now, queue, or drop."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from streamsnap.checkpoint.completed import CheckpointProperties
from streamsnap.checkpoint.reasons import CheckpointFailureReason as R
from streamsnap.checkpoint.request_decider import CheckpointRequestDecider, CheckpointTriggerRequest
from streamsnap.clock import ManualScheduler


def periodic():
    return CheckpointTriggerRequest(CheckpointProperties.for_checkpoint(is_periodic=True))


def manual():
    return CheckpointTriggerRequest(CheckpointProperties.for_checkpoint())


def savepoint():
    return CheckpointTriggerRequest(CheckpointProperties.for_savepoint(), target_directory="/sp")


@pytest.fixture
def clock():
    return ManualScheduler()


def decide(decider, request, pending=0, triggering=False, last=None):
    return decider.choose_request_to_execute(request, is_triggering=triggering, num_pending=pending,
                                             last_completion=last)


def queued(decider, pending=0, triggering=False, last=None):
    return decider.choose_queued_request(is_triggering=triggering, num_pending=pending, last_completion=last)


def test_runs_at_once_when_nothing_is_pending(clock):
    decider = CheckpointRequestDecider(1, 0.0, clock)
    request = manual()
    assert decide(decider, request).execute is request
    assert len(decider) == 0


def test_max_concurrent_queues_then_runs_in_order(clock):
    decider = CheckpointRequestDecider(2, 0.0, clock)
    first, second, third = manual(), manual(), manual()
    assert decide(decider, first, pending=1).execute is first
    decision = decide(decider, second, pending=2)
    assert decision.execute is None and decision.rejected == ()
    decide(decider, third, pending=2)
    assert decider.queued == [second, third]
    assert queued(decider, pending=2).execute is None
    assert queued(decider, pending=1).execute is second
    assert queued(decider, pending=1).execute is third


def test_nothing_starts_while_triggering(clock):
    decider = CheckpointRequestDecider(5, 0.0, clock)
    request = manual()
    assert decide(decider, request, triggering=True).execute is None
    assert queued(decider, triggering=True).execute is None
    assert queued(decider).execute is request


def test_second_periodic_request_is_dropped(clock):
    decider = CheckpointRequestDecider(1, 0.0, clock)
    first, second = periodic(), periodic()
    decide(decider, first, pending=1)
    decision = decide(decider, second, pending=1)
    assert [(r.request, r.reason) for r in decision.rejected] == [(second, R.TOO_MANY_CHECKPOINT_REQUESTS)]
    assert decider.queued == [first]


def test_savepoints_first_then_manual_then_periodic(clock):
    decider = CheckpointRequestDecider(1, 0.0, clock)
    p, m1, s1, m2, s2 = periodic(), manual(), savepoint(), manual(), savepoint()
    for request in (p, m1, s1, m2, s2):
        decide(decider, request, pending=1, triggering=True)
    assert decider.queued == [s1, s2, m1, m2, p]


def test_savepoint_ignores_max_concurrent(clock):
    decider = CheckpointRequestDecider(1, 0.0, clock)
    waiting = manual()
    decide(decider, waiting, pending=1)
    request = savepoint()
    assert decide(decider, request, pending=1).execute is request
    assert decider.queued == [waiting]


def test_full_queue_refuses_user_requests_and_evicts_periodic(clock):
    decider = CheckpointRequestDecider(1, 0.0, clock, max_queued=2)
    p, m1, m2, m3 = periodic(), manual(), manual(), manual()
    decide(decider, p, pending=1)
    decide(decider, m1, pending=1)
    decision = decide(decider, m2, pending=1)  # the periodic one makes room
    assert [(r.request, r.reason) for r in decision.rejected] == [(p, R.TOO_MANY_CHECKPOINT_REQUESTS)]
    decision = decide(decider, m3, pending=1)  # only user requests wait: the new one is refused
    assert [(r.request, r.reason) for r in decision.rejected] == [(m3, R.TOO_MANY_CHECKPOINT_REQUESTS)]
    assert decider.queued == [m1, m2]


def test_min_pause_drops_early_periodic_request_with_retry_time(clock):
    decider = CheckpointRequestDecider(1, 10.0, clock)
    last = clock.monotonic()
    clock.advance(4.0)
    request = periodic()
    decision = decide(decider, request, last=last)
    assert decision.execute is None
    assert [(r.request, r.reason) for r in decision.rejected] == [(request, R.MINIMUM_TIME_BETWEEN_CHECKPOINTS)]
    assert decision.retry_after == pytest.approx(6.0)
    assert len(decider) == 0
    clock.advance(6.0)
    request = periodic()
    assert decide(decider, request, last=last).execute is request


def test_min_pause_does_not_hold_back_user_requests(clock):
    decider = CheckpointRequestDecider(1, 10.0, clock)
    last = clock.monotonic()
    for request in (manual(), savepoint()):
        assert decide(decider, request, last=last).execute is request


def test_no_pause_before_the_first_completion(clock):
    decider = CheckpointRequestDecider(1, 10.0, clock)
    assert decider.remaining_pause(None) == 0.0
    request = periodic()
    assert decide(decider, request, last=None).execute is request


def test_drain(clock):
    decider = CheckpointRequestDecider(1, 0.0, clock)
    requests = [manual(), savepoint()]
    for request in requests:
        decide(decider, request, pending=1, triggering=True)
    assert decider.drain() == [requests[1], requests[0]]
    assert len(decider) == 0


def test_rejects_bad_limits(clock):
    with pytest.raises(ValueError):
        CheckpointRequestDecider(0, 0.0, clock)
    with pytest.raises(ValueError):
        CheckpointRequestDecider(1, -1.0, clock)
    with pytest.raises(ValueError):
        CheckpointRequestDecider(1, 0.0, clock, max_queued=0)


KINDS = {"periodic": periodic, "manual": manual, "savepoint": savepoint}


@given(st.lists(st.tuples(st.sampled_from(sorted(KINDS) + ["finish"]), st.booleans()), max_size=60),
       st.integers(1, 3), st.integers(1, 4))
def test_every_request_is_accounted_for_and_limits_hold(steps, max_concurrent, max_queued):
    clock = ManualScheduler()
    decider = CheckpointRequestDecider(max_concurrent, 0.0, clock, max_queued=max_queued)
    running: list[CheckpointTriggerRequest] = []
    rejected: list[CheckpointTriggerRequest] = []
    submitted: list[CheckpointTriggerRequest] = []
    started: list[CheckpointTriggerRequest] = []

    def apply(decision):
        rejected.extend(r.request for r in decision.rejected)
        if decision.execute is not None:
            # Only savepoints may exceed max_concurrent.
            assert decision.execute.forced or len(running) < max_concurrent
            running.append(decision.execute)
            started.append(decision.execute)

    for kind, drain_after in steps:
        if kind == "finish":
            if running:
                running.pop(0)
            apply(queued(decider, pending=len(running)))
        else:
            request = KINDS[kind]()
            submitted.append(request)
            apply(decide(decider, request, pending=len(running)))
        if drain_after:
            apply(queued(decider, pending=len(running)))
        assert len(decider) <= max_queued
        assert sum(r.is_periodic for r in decider.queued) <= 1
        waiting = decider.queued
        assert [r.priority for r in waiting] == sorted(r.priority for r in waiting)
    # Each request ends up exactly once: started, rejected, or still waiting.
    outcomes = [id(r) for r in started + rejected + decider.queued]
    assert sorted(outcomes) == sorted(id(r) for r in submitted)
