"""The changelog's bookkeeping, event by event, against a model of the task, the checkpoint
storage and the coordinator (the real SharedStateRegistry does the reference counting and
deletes what no retained checkpoint references)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.checkpoint import filesystem
from streamsnap.checkpoint.shared_registry import SharedStateRegistry
from streamsnap.state.backends.changelog_bookkeeping import ChangelogBookkeeping, EMPTY


class Model:
    """One task's keyed state (a dict), its log and materializations, checkpoint storage (a
    dict of files) and a coordinator with `num_retained` that registers shared files on
    acknowledgement, aborts a checkpoint whose reused file is gone, and subsumes the oldest
    retained one on completion — the rules of streamsnap.checkpoint.pending/completed."""

    def __init__(self, num_retained: int = 1, interval: float = 1e9, max_log_bytes: int = 1 << 60):
        self.now = 0.0
        self.book = ChangelogBookkeeping(interval, max_log_bytes, self.now)
        self.state: dict[int, int] = {}
        self.current: dict[int, int | None] = {}      # writes since the last cut
        self.files: dict[str, object] = {}
        self.registry = SharedStateRegistry(delete=self.files.pop)
        self.num_retained = num_retained
        self.retained: list[int] = []
        self.pending: list[tuple[int, list[str], list[str], dict]] = []   # id, files, new, expected
        self.handles: dict[int, tuple] = {}          # completed checkpoint -> (mat file, segment files)
        self.notifications: list[tuple[str, int]] = []
        self.materializing: dict[int, dict] = {}     # running background materialization -> snapshot
        self.names = itertools.count()
        self.next_id = 1

    # -- the task ---------------------------------------------------------------------

    def write(self, key: int, value: int | None) -> None:
        if value is None:
            self.state.pop(key, None)
        else:
            self.state[key] = value
        self.current[key] = value

    def _upload(self, what: str, content) -> str:
        url = filesystem.normalize(f"file:///store/{what}-{next(self.names)}")
        self.files[url] = content
        return url

    def checkpoint(self) -> int:
        """Cut, run the asynchronous part at once, acknowledge later (`complete_oldest`)."""
        cid = self.next_id
        self.next_id += 1
        self.now += 1.0
        content, self.current = self.current, {}
        plan = self.book.cut(cid, content, self.now)
        snapshot = dict(self.state)               # the state at the cut (what restore must give)
        if plan.start is not None:
            if plan.inline:
                handle = self._upload("mat", (plan.start.upto, snapshot))
                assert self.book.materialization_finished(plan.start.id, handle)
            else:
                self.materializing[plan.start.id] = snapshot
        files, new = [], []
        m = plan.materialization
        if m is not None:
            assert m.handle is not None
            files.append(m.handle)
            if plan.materialization_new:
                new.append(m.handle)
        segments = []
        for s in plan.segments:
            if s.new:
                url = self._upload("seg", dict(s.content))
                self.book.segment_uploaded(cid, s.seq, url, 10 + len(s.content))
                new.append(url)
            else:
                url = s.upload
            files.append(url)
            segments.append((s.seq, url))
        self.handles[cid] = (m.handle if m is not None else None, m.upto if m else EMPTY, segments)
        self.pending.append((cid, files, new, snapshot))
        return cid

    def finish_materialization(self, fail: bool = False) -> None:
        for mid, snapshot in list(self.materializing.items()):
            del self.materializing[mid]
            if fail:
                self.book.materialization_failed(mid)
                continue
            upto = next(m.upto for m in [self.book._running[mid]])
            handle = self._upload("mat", (upto, snapshot))
            if not self.book.materialization_finished(mid, handle):
                del self.files[handle]

    def deliver(self) -> None:
        for kind, cid in self.notifications:
            if kind == "complete":
                self.book.checkpoint_complete(cid)
            else:
                self.book.checkpoint_aborted(cid)
        self.notifications.clear()

    # -- the coordinator --------------------------------------------------------------

    def complete_oldest(self) -> bool:
        if not self.pending:
            return False
        cid, files, new, _ = self.pending.pop(0)
        reused = [f for f in files if f not in new]
        if any(not self.registry.is_registered(f) for f in reused):   # SHARED_STATE_DISCARDED
            self._discard_new(new)
            self.notifications.append(("abort", cid))
            return False
        self.registry.register(cid, files)
        assert all(f in self.files for f in files), f"checkpoint {cid} completes with a deleted file"
        self.retained.append(cid)
        while len(self.retained) > self.num_retained:
            self.registry.unregister(self.retained.pop(0))
        self.notifications.append(("complete", cid))
        return True

    def abort_oldest(self) -> None:
        if not self.pending:
            return
        cid, _, new, _ = self.pending.pop(0)
        self.registry.unregister(cid)
        self._discard_new(new)
        self.notifications.append(("abort", cid))

    def _discard_new(self, new: list[str]) -> None:
        for f in new:
            if not self.registry.is_registered(f):
                self.files.pop(f, None)

    # -- checks -----------------------------------------------------------------------

    def restore(self, cid: int) -> dict:
        mat, upto, segments = self.handles[cid]
        state = {}
        if mat is not None:
            mat_upto, snapshot = self.files[mat]
            assert mat_upto == upto
            state = dict(snapshot)
        last = upto
        for seq, url in segments:
            assert seq == last + 1, f"checkpoint {cid}: segment {seq} follows {last}"
            last = seq
            for key, value in self.files[url].items():
                if value is None:
                    state.pop(key, None)
                else:
                    state[key] = value
        return state

    def check_retained(self, expected: dict[int, dict]) -> None:
        for cid in self.retained:
            mat, _, segments = self.handles[cid]
            for f in ([mat] if mat else []) + [url for _, url in segments]:
                assert f in self.files, f"retained checkpoint {cid} lost {f}"
            assert self.restore(cid) == expected[cid], f"checkpoint {cid} restores another state"


def run(model: Model, steps) -> dict[int, dict]:
    expected: dict[int, dict] = {}
    for op, arg in steps:
        if op == "write":
            model.write(arg % 23, None if arg % 7 == 0 else arg)
        elif op == "checkpoint":
            model.checkpoint()
            expected[model.pending[-1][0]] = model.pending[-1][3]
        elif op == "complete":
            model.complete_oldest()
        elif op == "abort":
            model.abort_oldest()
        elif op == "materialized":
            model.finish_materialization(fail=arg % 5 == 0)
        elif op == "deliver":
            model.deliver()
        elif op == "lose" and model.notifications:       # notices are best effort
            model.notifications.pop(arg % len(model.notifications))
        elif op == "time":
            model.now += arg
        model.check_retained(expected)
    return expected


OPS = st.one_of(
    st.tuples(st.just("write"), st.integers(0, 200)),
    st.tuples(st.just("checkpoint"), st.just(0)),
    st.tuples(st.just("complete"), st.just(0)),
    st.tuples(st.just("abort"), st.just(0)),
    st.tuples(st.just("materialized"), st.integers(0, 9)),
    st.tuples(st.just("deliver"), st.just(0)),
    st.tuples(st.just("lose"), st.integers(0, 5)),
    st.tuples(st.just("time"), st.integers(1, 5)),
)


@settings(max_examples=examples(300), deadline=None)
@given(num_retained=st.integers(1, 3), interval=st.integers(1, 6), max_log=st.integers(20, 400),
       restored=st.booleans(), steps=st.lists(OPS, max_size=80))
def test_no_retained_checkpoint_loses_a_file_and_each_restores_its_state(num_retained, interval, max_log,
                                                                          restored, steps):
    model = Model(num_retained, interval, max_log)
    if restored:      # state restored that no log continues: the first checkpoint materializes
        model.book.restored_without_log()
    expected = run(model, steps)
    # Quiet down: everything delivered, materializations finished; a checkpoint then completes,
    # and the log in memory is only what no completed checkpoint holds yet.
    model.finish_materialization()
    while model.pending:
        model.complete_oldest()
    model.deliver()
    for attempt in range(2):     # a lost abort notice may cost one more failed checkpoint
        model.write(1, attempt)
        cid = model.checkpoint()
        expected[cid] = model.pending[-1][3]
        completed = model.complete_oldest()
        model.deliver()
        if completed:
            break
    assert completed, "checkpoints after a quiet period must complete"
    model.check_retained(expected)
    assert model.book.segments_in_memory() == []


def test_a_checkpoint_is_one_cut_and_uploads_only_new_segments():
    model = Model()
    model.write(1, 10)
    c1 = model.checkpoint()
    assert model.handles[c1][0] is None and [s for s, _ in model.handles[c1][2]] == [0]
    model.complete_oldest()
    model.deliver()
    model.write(2, 20)
    c2 = model.checkpoint()
    _, _, segments = model.handles[c2]
    assert [s for s, _ in segments] == [0, 1]
    assert model.pending[-1][2] == [segments[1][1]]           # only segment 1 is new
    assert model.book.segments_in_memory() == [1]


def test_materialization_becomes_the_base_when_a_checkpoint_referencing_it_completes():
    model = Model(interval=2)
    for cid in range(1, 4):
        model.write(cid, cid)
        model.checkpoint()
        model.complete_oldest()
        model.deliver()
    assert model.book.running() == [2]                  # started at checkpoint 2's cut (t=2)
    model.finish_materialization()
    assert model.book.candidate.upto == 1 and model.book.base.id == EMPTY
    model.write(9, 9)
    c4 = model.checkpoint()
    mat, upto, segments = model.handles[c4]
    assert mat is not None and upto == 1 and [s for s, _ in segments] == [2, 3]
    assert model.book.known_segments() == [0, 1, 2, 3]  # still kept: the candidate is unconfirmed
    model.complete_oldest()
    model.deliver()
    assert model.book.base.id == 2 and model.book.known_segments() == [2, 3]


def test_due_within_says_when_the_next_cut_will_start_a_materialization():
    book = ChangelogBookkeeping(10.0, 1 << 20, 0.0)
    book.cut(1, {}, 1.0)
    assert not book.due_within(8.0, 1.0) and book.due_within(9.0, 1.0)
    plan = book.cut(2, {}, 10.0)
    assert plan.start is not None
    assert not book.due_within(30.0, 1.0)        # one is running: none starts at the next cut
    book.restored_without_log()
    assert not book.due_within(30.0, 1.0)        # the next cut materializes inline anyway


def test_a_candidate_whose_first_checkpoint_aborts_is_dropped_and_redone():
    model = Model(interval=1)
    model.write(1, 1)
    model.checkpoint()                    # starts a materialization at its cut
    model.complete_oldest()
    model.deliver()
    model.finish_materialization()
    c2 = model.checkpoint()
    assert model.pending[-1][2][0] == model.handles[c2][0]    # registers the materialization as new
    model.abort_oldest()                  # ... and is aborted: the files are deleted
    assert model.handles[c2][0] not in model.files
    model.deliver()
    assert model.book.candidate is None and model.book.base.id == EMPTY
    c3 = model.checkpoint()
    assert model.handles[c3][0] is None                       # back to the old base (empty)
    assert model.book.running() == [c3]                       # and materializing again
    assert model.complete_oldest()


def test_after_a_restore_without_log_the_first_checkpoint_materializes_inline():
    model = Model()
    model.state = {1: 1, 2: 2}            # restored from, e.g., a savepoint
    model.book.restored_without_log()
    c1 = model.checkpoint()
    mat, upto, segments = model.handles[c1]
    assert mat is not None and upto == 0 and segments == []
    assert model.complete_oldest()
    model.deliver()
    assert model.book.base.id == c1
    assert model.restore(c1) == {1: 1, 2: 2}


def test_checkpoint_ids_must_increase():
    book = ChangelogBookkeeping(10.0, 1 << 20, 0.0)
    book.cut(5, {}, 0.0)
    with pytest.raises(ValueError, match="checkpoint 5 cut after checkpoint 5"):
        book.cut(5, {}, 0.0)
