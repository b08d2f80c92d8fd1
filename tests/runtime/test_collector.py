"""The task's collector tuning: what exists at set-up is frozen out of full collections and the
first-generation threshold raised, both undone at teardown, and the switch turns it off."""

import gc

from streamsnap.runtime.collector import YOUNG_THRESHOLD, freeze_after_setup, unfreeze_at_teardown


def test_setup_objects_are_frozen_until_teardown(monkeypatch):
    monkeypatch.delenv("STREAMSNAP_GC_FREEZE", raising=False)
    before = gc.get_threshold()
    try:
        kept = [object() for _ in range(10)]
        assert freeze_after_setup()
        assert gc.get_freeze_count() >= len(kept)
        assert gc.get_threshold()[0] >= YOUNG_THRESHOLD and gc.get_threshold()[1:] == before[1:]
    finally:
        unfreeze_at_teardown()
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("STREAMSNAP_GC_FREEZE", "0")
    before = gc.get_threshold()
    assert not freeze_after_setup()
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
