"""Version enumeration of the continuous table sources: pure decisions, no Spark, no table."""

from __future__ import annotations

import pytest

from streamsnap.connectors.files import owner_of
from streamsnap.connectors.lakehouse.delta_source import classify_commit
from streamsnap.connectors.lakehouse.enumeration import Enumeration
from streamsnap.errors import RestoreError, StreamsnapError

FILES = [f"part-{n}.parquet" for n in range(40)]


def run(enumerations, versions: dict[int, list[str]], until: dict[int, int]) -> dict[str, int]:
    """Each subtask i enumerates versions up to until[i] (exclusive); returns file -> taker."""
    taken = {}
    for e in enumerations:
        for version in range(e.next_version, until[e.subtask]):
            for path in versions.get(version, []):
                if e.takes(path, version):
                    assert path not in taken, f"{path} taken twice"
                    taken[path] = e.subtask
            e.enumerated(version)
    return taken


def restore(enumerations, parallelism):
    elements = [x for e in enumerations for x in e.elements()]
    return [Enumeration.restore(elements, i, parallelism, "test") for i in range(parallelism)]


def test_every_file_is_taken_once_over_uneven_progress_and_rescales():
    versions = {v: FILES[(v - 1) * 4:v * 4] for v in range(1, 11)}   # versions 1..10, 4 files each
    first = [Enumeration(i, 2, 1) for i in range(2)]
    taken = run(first, versions, {0: 7, 1: 3})           # subtask 0 far ahead of subtask 1
    second = restore(first, 3)
    assert all(e.next_version == 3 for e in second)      # everyone restarts at the slowest
    more = run(second, versions, {0: 5, 1: 9, 2: 4})
    assert not set(taken) & set(more)
    taken.update(more)
    third = restore(second, 1)
    taken.update(run(third, versions, {0: 11}))
    assert sorted(taken) == sorted(FILES)


def test_a_generation_is_forgotten_once_every_later_subtask_passed_it():
    first = [Enumeration(i, 2, 5) for i in range(2)]
    first[0].enumerated(5)                                # nexts (6, 5)
    second = restore(first, 2)
    assert [g.nexts for g in second[0].inherited] == [(6, 5)]
    for e in second:
        e.enumerated(5)
        e.enumerated(6)
    third = restore(second, 2)
    assert third[0].inherited == () and third[0].next_version == 7
    assert len(third[0].elements()) == 1 and third[1].elements() == [[2, 2, 1, 7]]


def test_only_the_owner_takes_a_file():
    path = FILES[0]
    owner = owner_of(path, 3)
    assert [Enumeration(i, 3, 0).takes(path, 0) for i in range(3)] == [i == owner for i in range(3)]


def test_restore_refuses_incomplete_or_foreign_state():
    with pytest.raises(RestoreError, match=r"subtask\(s\) \[1\] of 2"):
        Enumeration.restore([[0, 2, 0, 4]], 0, 2, "Delta(delta)")
    with pytest.raises(RestoreError, match="holds no enumerated versions"):
        Enumeration.restore([], 0, 2, "Delta(delta)")
    with pytest.raises(RestoreError, match="cannot restore the enumerated versions"):
        Enumeration.restore(["a/b"], 0, 2, "Delta(delta)")


def test_a_version_cannot_be_enumerated_twice():
    e = Enumeration(0, 1, 3)
    e.enumerated(3)
    with pytest.raises(ValueError, match="enumerated twice"):
        e.enumerated(3)


# ===================================================================== Delta commits
def add(path, data_change=True, **extra):
    return {"add": {"path": path, "partitionValues": {}, "dataChange": data_change, **extra}}


def remove(path, data_change=True):
    return {"remove": {"path": path, "dataChange": data_change}}


def info(operation):
    return {"commitInfo": {"operation": operation}}


def test_an_append_streams_its_added_files_decoded():
    version = classify_commit(4, [info("WRITE"), add("k=a%20b/p-2.parquet"), add("p-1.parquet")], ["x"], "t")
    assert version.change is None and version.added == [["k=a b/p-2.parquet", {}], ["p-1.parquet", {}]]


def test_compaction_without_data_change_adds_nothing():
    version = classify_commit(5, [info("OPTIMIZE"), add("big.parquet", False), remove("p-1.parquet", False)],
                              ["x"], "t")
    assert version.change is None and version.added == []


@pytest.mark.parametrize("actions, named", [
    ([info("DELETE"), remove("p-1.parquet")], "operation DELETE: 1 file(s) removed"),
    ([info("UPDATE"), remove("p-1.parquet"), add("p-3.parquet")], "operation UPDATE"),
    ([info("DELETE"), add("p-1.parquet", deletionVector={"storageType": "u"})], "1 deletion vector"),
])
def test_removing_or_rewriting_data_is_a_change(actions, named):
    assert named in classify_commit(6, actions, ["x"], "t").change


def test_a_schema_change_fails_naming_the_version():
    meta = {"metaData": {"schemaString": '{"type":"struct","fields":[{"name":"x"},{"name":"y"}]}'}}
    with pytest.raises(StreamsnapError, match=r"version 7 of 't' changed the table's columns to \['x', 'y'\]"):
        classify_commit(7, [meta, add("p.parquet")], ["x"], "t")
    assert classify_commit(7, [{"metaData": {"schemaString": '{"fields":[{"name":"x"}]}'}}], ["x"], "t").change is None
