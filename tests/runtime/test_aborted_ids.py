"""The aborted checkpoint ids a task and its barrier handler remember stay bounded over a long
job, and still recognise a checkpoint aborted before it reached the task."""

from streamsnap.clock import ManualScheduler
from streamsnap.runtime.aborted_ids import AbortedIds
from streamsnap.runtime.barriers import CheckpointBarrierAligner
from streamsnap.runtime.events import CheckpointBarrier, CheckpointOptions


def test_a_task_remembers_only_the_aborts_ahead_of_it_over_many_checkpoints():
    aborted = AbortedIds()
    skipped = 0
    for checkpoint_id in range(1, 100_001):
        if checkpoint_id % 3 == 0:
            aborted.add(checkpoint_id)          # the abort overtook the trigger
        if checkpoint_id % 7 == 0:
            aborted.add(checkpoint_id + 2)      # and one ahead of the task by two checkpoints
        aborted.forget_below(checkpoint_id)     # the trigger arrives (perform_checkpoint)
        if checkpoint_id in aborted:
            skipped += 1
        assert len(aborted) <= 3
    # Every id aborted before its trigger was still recognised when the trigger came.
    assert skipped == len({i for i in range(1, 100_001) if i % 3 == 0 or (i >= 9 and (i - 2) % 7 == 0)})


def test_ids_behind_the_task_are_not_taken_and_the_window_is_capped():
    aborted = AbortedIds(limit=4)
    aborted.forget_below(10)
    aborted.add(9)                                 # a late abort of a checkpoint already passed
    assert 9 not in aborted and not aborted
    for checkpoint_id in range(11, 21):            # a task that sees no checkpoint for long
        aborted.add(checkpoint_id)
    assert len(aborted) == 4 and 20 in aborted and 16 not in aborted


class _Actions:
    def __getattr__(self, name):
        return lambda *args: None


def test_the_barrier_handlers_aborts_ahead_stay_bounded_over_many_checkpoints():
    handler = CheckpointBarrierAligner(2, _Actions(), ManualScheduler(), "op (1/1)")
    options = CheckpointOptions()
    for checkpoint_id in range(1, 20_001):
        handler.on_checkpoint_aborted(checkpoint_id + 1)   # the next one is aborted already
        for channel in (0, 1):
            handler.process_barrier(CheckpointBarrier(checkpoint_id, 0.0, options), channel)
        assert len(handler._aborted_ahead) <= 1
    assert handler.latest_checkpoint_id == 20_000
