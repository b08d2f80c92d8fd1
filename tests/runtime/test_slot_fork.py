"""A slot forks its subtasks with what they inherit frozen (runtime/slot_supervisor.py): a
subtask's first full collection (runtime/collector.py) then walks only the objects it built,
not the interpreter, pyspark, pyarrow and numpy it inherited; the slot itself is unfrozen."""

from __future__ import annotations

import gc
from types import SimpleNamespace

from streamsnap.runtime import slot_supervisor


def _report(deployment, task_index, host, sender, parent_pid, inherited):
    sender.send((task_index, gc.get_freeze_count()))
    sender.close()


def test_subtasks_inherit_the_slots_objects_frozen_and_the_slot_does_not_keep_them_frozen(monkeypatch):
    monkeypatch.setattr(slot_supervisor, "_run_child", _report)
    slot = slot_supervisor.SlotSupervisor(SimpleNamespace(slots=[[0, 1]]), 0, "127.0.0.1")
    before = len(gc.get_objects())
    slot._fork(slot.deployment)
    reports = {}
    for index, (child, receiver) in slot._children.items():
        reports[index] = receiver.recv()
        child.join(10)
        receiver.close()
        assert child.exitcode == 0
    assert sorted(reports) == [0, 1]
    assert all(frozen >= before // 2 for _, frozen in reports.values())    # what they inherited
    assert gc.get_freeze_count() == 0
