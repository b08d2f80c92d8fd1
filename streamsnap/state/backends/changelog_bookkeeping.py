"""The bookkeeping of the changelog mode of the RocksDB backend (Flink's FLIP-158), sans-I/O.

Why a module of its own: with the changelog a checkpoint's keyed state is "the last
materialization + every log segment after it". Getting that set wrong loses state silently —
a segment forgotten while a checkpoint still needs it, an upload reused after the coordinator
deleted it — so the decisions live here, in a plain class fed events (a cut, an upload, a
materialization finished, a checkpoint completed or aborted) and the time, and tested event by
event. The I/O shell (`changelog.py`) encodes, uploads and restores.

Terms:

* the log is cut into **segments** numbered 0, 1, 2, ...: the writes between two cuts. Every
  checkpoint cuts one (its synchronous part does nothing else).
* a **materialization** is a RocksDB snapshot taken at a cut (named by the checkpoint whose cut
  it is); it holds every segment up to and including `upto`. The *base* is the materialization
  the next checkpoints build on: the last one a completed checkpoint referenced (or restored
  from); `upto == -1` is the empty state of a fresh start. A materialization that finished but
  was not yet part of a completed checkpoint is the *candidate*: checkpoints reference it, and
  the first completed one makes it the base — only then are the segments it covers forgotten,
  so a failed candidate costs nothing but a new materialization.
* an upload (segment file, materialization files) is reused by later checkpoints only once a
  checkpoint that carried it completed, as `rocksdb.incremental` does for SST files: the files
  of a checkpoint that failed may already be deleted. A segment's content stays in memory
  until it has such a confirmed upload.

Materializations start at a checkpoint's cut (the mailbox thread is there anyway, and the
RocksDB snapshot must be taken exactly at a cut) when `materialization_interval` seconds passed
since the last one, or the log after the base holds `max_log_bytes`, and none is running or
waiting to be confirmed; their upload runs in the background. After a restore that cannot
continue the restored log (rescaled, several handles, or not changelog state at all) there is
no base: the next checkpoint materializes *inline* — its asynchronous part uploads the
materialization and references it.

Objects handed in (segment contents, uploads, materialization handles) are opaque here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


EMPTY = -1


@dataclass
class Materialization:
    """A RocksDB snapshot taken at the cut of checkpoint `id`, holding segments ≤ `upto`.
    `handle` is its upload once finished (None for the empty state, or while running)."""

    id: int
    upto: int
    handle: Any = None
    finished: bool = False
    # The first checkpoint that referenced it (it registers its files as new).
    first_referenced_by: int | None = None


@dataclass
class _Segment:
    seq: int
    content: Any                  # in memory until a confirmed upload exists, then None
    upload: Any = None            # confirmed upload: reused by later checkpoints
    upload_by: int = EMPTY        # the completed checkpoint that carried it
    size: int = 0                 # bytes of an upload of it (0: not uploaded yet)
    pending: dict[int, Any] = field(default_factory=dict)   # checkpoint -> unconfirmed upload


@dataclass(frozen=True)
class SegmentPlan:
    """A segment a checkpoint references: reuse `upload`, or upload `content` (new)."""

    seq: int
    upload: Any = None
    content: Any = None

    @property
    def new(self) -> bool:
        return self.upload is None


@dataclass(frozen=True)
class CheckpointPlan:
    """What a checkpoint consists of, decided at its cut.

    `materialization`: its base (None: the empty state); `materialization_new`: this is the
    first checkpoint to reference it (its files count as written by this one); `inline`: the
    base is being taken at this very cut and the checkpoint's asynchronous part uploads it.
    `start`: a materialization to take now, at this cut (inline or in the background)."""

    checkpoint_id: int
    cut: int
    materialization: Materialization | None
    materialization_new: bool
    segments: tuple[SegmentPlan, ...]
    start: Materialization | None = None
    inline: bool = False


@dataclass
class _Record:
    """A checkpoint that was cut and is neither complete nor aborted yet."""

    materialization: Materialization | None
    materialization_new: bool
    uploads: dict[int, Any] = field(default_factory=dict)   # seq -> upload made for it


class ChangelogBookkeeping:
    """Segments, materializations and pending checkpoints of one keyed backend."""

    def __init__(self, materialization_interval: float, max_log_bytes: int, now: float):
        self.materialization_interval = materialization_interval
        self.max_log_bytes = max_log_bytes
        self._next_seq = 0
        self._segments: dict[int, _Segment] = {}
        # None: no usable base (after a restore the log cannot continue): materialize inline.
        self._base: Materialization | None = Materialization(EMPTY, EMPTY, finished=True)
        self._candidate: Materialization | None = None
        self._running: dict[int, Materialization] = {}
        self._records: dict[int, _Record] = {}
        self._last_cut_id: int | None = None
        self._last_started = now
        self._due = False            # a candidate failed: materialize at the next cut

    # -- inspection ---------------------------------------------------------------------

    @property
    def base(self) -> Materialization | None:
        return self._base

    @property
    def candidate(self) -> Materialization | None:
        return self._candidate

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def segments_in_memory(self) -> list[int]:
        """Segments whose content is still held (no confirmed upload yet)."""
        return sorted(s.seq for s in self._segments.values() if s.content is not None)

    def known_segments(self) -> list[int]:
        return sorted(self._segments)

    def running(self) -> list[int]:
        return sorted(self._running)

    def live_materializations(self) -> list[int]:
        """Ids of the materializations checkpoints from now on may build on — the base, the
        candidate, the running ones: what task-local recovery must keep locally."""
        ids = {m.id for m in (self._base, self._candidate) if m is not None and m.id != EMPTY}
        return sorted(ids | set(self._running))

    def log_bytes(self) -> int:
        """Uploaded bytes of the segments after the newest usable base."""
        base = self._usable_base()
        upto = base.upto if base is not None else EMPTY
        return sum(s.size for s in self._segments.values() if s.seq > upto)

    # -- the checkpoint's synchronous part ------------------------------------------------

    def _usable_base(self) -> Materialization | None:
        return self._candidate if self._candidate is not None else self._base

    def cut(self, checkpoint_id: int, content: Any, now: float) -> CheckpointPlan:
        """Close the current segment with `content` (the writes since the last cut) for
        checkpoint `checkpoint_id`; returns what the checkpoint consists of."""
        if self._last_cut_id is not None and checkpoint_id <= self._last_cut_id:
            raise ValueError(f"checkpoint {checkpoint_id} cut after checkpoint {self._last_cut_id}: "
                             f"checkpoint ids must increase")
        self._last_cut_id = checkpoint_id
        seq = self._next_seq
        self._next_seq += 1
        self._segments[seq] = _Segment(seq, content)
        base = self._usable_base()
        if base is None:
            # Nothing to build on: this checkpoint's own materialization is its base.
            start = Materialization(checkpoint_id, seq, first_referenced_by=checkpoint_id)
            self._running[checkpoint_id] = start
            self._last_started = now
            self._records[checkpoint_id] = _Record(start, True)
            return CheckpointPlan(checkpoint_id, seq, start, True, (), start, inline=True)
        new = False
        if base.id != EMPTY and base.first_referenced_by is None:
            base.first_referenced_by = checkpoint_id
            new = True
        plans = []
        for s in range(base.upto + 1, seq + 1):
            segment = self._segments[s]
            if segment.upload is not None:
                plans.append(SegmentPlan(s, upload=segment.upload))
            else:
                assert segment.content is not None, f"segment {s} has neither content nor upload"
                plans.append(SegmentPlan(s, content=segment.content))
        start = None
        if self._candidate is None and not self._running and (
                self._due or now - self._last_started >= self.materialization_interval
                or self.log_bytes() >= self.max_log_bytes):
            start = self._running[checkpoint_id] = Materialization(checkpoint_id, seq)
            self._last_started = now
            self._due = False
        self._records[checkpoint_id] = _Record(base if base.id != EMPTY else None, new)
        return CheckpointPlan(checkpoint_id, seq, base if base.id != EMPTY else None, new,
                              tuple(plans), start)

    def due_within(self, now: float, lead: float) -> bool:
        """A materialization would start at a cut `lead` seconds from now (none is running or
        waiting for confirmation, and the interval or the log size is reached by then): the
        shell flushes RocksDB's memtables ahead of it, so that cut's snapshot is cheap."""
        if self._base is None or self._candidate is not None or self._running:
            return False
        return (self._due or now + lead - self._last_started >= self.materialization_interval
                or self.log_bytes() >= self.max_log_bytes)

    # -- asynchronous results -----------------------------------------------------------

    def segment_uploaded(self, checkpoint_id: int, seq: int, upload: Any, size: int) -> None:
        """Checkpoint `checkpoint_id` uploaded segment `seq` (reusable once it completes)."""
        segment = self._segments.get(seq)
        record = self._records.get(checkpoint_id)
        if segment is None or record is None:
            return                      # forgotten meanwhile (a newer base, or aborted)
        segment.pending[checkpoint_id] = upload
        segment.size = size
        record.uploads[seq] = upload

    def materialization_finished(self, materialization_id: int, handle: Any) -> bool:
        """A materialization's upload finished. False: it was dropped meanwhile (the checkpoint
        it was inline for failed); the caller deletes what it uploaded."""
        m = self._running.pop(materialization_id, None)
        if m is None:
            return False
        m.handle, m.finished = handle, True
        current = self._usable_base()
        if current is None or m.upto > current.upto:
            self._candidate = m
        return True

    def materialization_failed(self, materialization_id: int) -> None:
        """A materialization could not be taken or uploaded: the next one starts when due (an
        inline one's checkpoint fails with it)."""
        m = self._running.pop(materialization_id, None)
        if m is not None and m.first_referenced_by is not None:
            self._records.pop(m.first_referenced_by, None)

    # -- notifications ------------------------------------------------------------------

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        """Its uploads become reusable; its base becomes the base (older segments forgotten).
        Checkpoints cut before it that are still open will never complete: dropped."""
        for older in [c for c in self._records if c < checkpoint_id]:
            self._forget(older, aborted=False)
        record = self._records.pop(checkpoint_id, None)
        if record is None:
            return
        for seq, upload in record.uploads.items():
            segment = self._segments.get(seq)
            if segment is None:
                continue
            segment.pending.pop(checkpoint_id, None)
            # The newest completed checkpoint's upload: an older one's may be deleted once
            # that checkpoint is subsumed (its completion notice can arrive late).
            if checkpoint_id > segment.upload_by:
                segment.upload, segment.upload_by, segment.content = upload, checkpoint_id, None
        m = record.materialization
        if m is not None and (self._base is None or m.upto > self._base.upto):
            self._base = m
            if self._candidate is not None and self._candidate.upto <= m.upto:
                self._candidate = None
            for seq in [s for s in self._segments if s <= m.upto]:
                del self._segments[seq]

    def checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Its uploads may be deleted: never reused. The not yet confirmed materialization it
        referenced may be gone with it (the coordinator deletes what only the aborted checkpoint
        registered): dropped, and a new one is due. Dropping it also when another checkpoint
        registered it first costs a materialization, never a loop of checkpoints reusing
        deleted files."""
        self._forget(checkpoint_id, aborted=True)

    def _forget(self, checkpoint_id: int, aborted: bool) -> None:
        record = self._records.pop(checkpoint_id, None)
        if record is None:
            return
        for seq in record.uploads:
            segment = self._segments.get(seq)
            if segment is not None:
                segment.pending.pop(checkpoint_id, None)
        m = record.materialization
        if not aborted or m is None:
            return
        if self._running.pop(m.id, None) is not None or self._candidate is m:
            if self._candidate is m:
                self._candidate = None
            self._due = True

    # -- restore ------------------------------------------------------------------------

    def restored(self, materialization: Materialization | None,
                 segments: list[tuple[int, Any, int]]) -> None:
        """Continue the log of a restored checkpoint: its base (None: the empty state) and its
        segments `(seq, upload, size)` in order, all confirmed (a completed checkpoint holds
        them)."""
        if materialization is not None:
            materialization.finished = True
            if materialization.first_referenced_by is None:
                materialization.first_referenced_by = materialization.id
        self._base = materialization or Materialization(EMPTY, EMPTY, finished=True)
        self._candidate = None
        self._running.clear()
        self._records.clear()
        self._segments = {seq: _Segment(seq, None, upload, self._base.id, size)
                          for seq, upload, size in segments}
        self._next_seq = max([self._base.upto, *(seq for seq, _, _ in segments)]) + 1

    def restored_without_log(self) -> None:
        """State was restored that no log continues: the next checkpoint materializes inline."""
        self._base = None
        self._candidate = None
        self._running.clear()
        self._records.clear()
        self._segments.clear()


__all__ = ["ChangelogBookkeeping", "CheckpointPlan", "EMPTY", "Materialization", "SegmentPlan"]
