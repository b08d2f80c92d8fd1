"""The task's collector tuning: what exists at set-up is frozen out of full collections, unfrozen
at teardown, and the switch turns it off."""

import gc

from streamsnap.runtime.collector import freeze_after_setup, unfreeze_at_teardown


def test_setup_objects_are_frozen_until_teardown(monkeypatch):
    monkeypatch.delenv("STREAMSNAP_GC_FREEZE", raising=False)
    try:
        kept = [object() for _ in range(10)]
        assert freeze_after_setup()
        assert gc.get_freeze_count() >= len(kept)
    finally:
        unfreeze_at_teardown()
    assert gc.get_freeze_count() == 0


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("STREAMSNAP_GC_FREEZE", "0")
    assert not freeze_after_setup()
    assert gc.get_freeze_count() == 0
