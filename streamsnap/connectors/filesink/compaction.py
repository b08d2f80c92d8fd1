"""Combining a part's per-checkpoint segments into one part file, at the roll.

A part that stays open across checkpoints is written as one hidden *segment* per checkpoint
(closed, so durable, at the checkpoint's pre-commit). Parquet cannot be resumed mid-file — its
footer is written at close — and object stores cannot append, so a segment is never reopened;
at the roll the segments are combined into the part file: Parquet row groups are re-written
(batched into row groups of at least `ROW_GROUP_ROWS` rows, so small per-checkpoint segments do
not leave small row groups), JSON lines are concatenated byte by byte. A part of one segment is
not copied: the segment itself becomes the part.

Combining is deterministic and reads only closed segments that the checkpoints name, so doing it
again after a failover (the combined file of a failed attempt is deleted by recovery) writes the
same rows once.
"""

from __future__ import annotations

import hashlib
import json
import posixpath

import pyarrow as pa
import pyarrow.parquet as pq

from streamsnap.checkpoint import filesystem

ROW_GROUP_ROWS = 128 * 1024
COPY_CHUNK = 1 << 20


def combine(segments: list[str], target: str, format: str) -> int:
    """Write the rows of `segments` (URLs, in order) into `target`; returns its size in bytes."""
    if format == "parquet":
        _combine_parquet(segments, target)
    else:
        _concatenate(segments, target)
    fs, path = filesystem.filesystem(target)
    return int(fs.size(path))


def _concatenate(segments: list[str], target: str) -> None:
    with filesystem.open_write(target) as out:
        for url in segments:
            with filesystem.open_read(url) as f:
                while chunk := f.read(COPY_CHUNK):
                    out.write(chunk)


def _combine_parquet(segments: list[str], target: str) -> None:
    with filesystem.open_write(target) as out:
        writer: pq.ParquetWriter | None = None
        buffered: list[pa.Table] = []
        rows = 0
        for url in segments:
            with filesystem.open_read(url) as f:
                table = pq.read_table(f)
            if writer is None:
                writer = pq.ParquetWriter(out, table.schema)
            buffered.append(table)
            rows += table.num_rows
            if rows >= ROW_GROUP_ROWS:
                writer.write_table(pa.concat_tables(buffered), row_group_size=rows)
                buffered, rows = [], 0
        assert writer is not None, "a part has at least one segment"
        if buffered:
            writer.write_table(pa.concat_tables(buffered), row_group_size=max(rows, 1))
        writer.close()


def delete_quietly_missing(urls: list[str]) -> None:
    """Delete files that may already be gone (a second commit after a restore finds them gone)."""
    for url in urls:
        fs, path = filesystem.filesystem(url)
        if fs.exists(path):
            fs.rm(path)


# ===================================================================== a checkpoint's small files
# `FileSink(compact=True)` (Flink's `enableCompact`): the parts all subtasks rolled for one
# checkpoint become one file (one per schema) instead of one per subtask. Exactly-once without a
# coordinator, through the file system:
#
# * At pre-commit n each subtask that rolled parts writes a hidden manifest `.compact-<n>-...`
#   naming them, and keeps them in its state (marked with n and the run's target name).
# * At commit n (checkpoint n complete: every manifest of n is durable) subtask 0 merges the
#   files the manifests of n name into a hidden file, renames it into place under the target
#   name, and only then deletes the sources and manifests.
# * A subtask keeps a compacted committable in its state as long as its source exists, so a
#   restored checkpoint names every source of a merge that had not happened; one whose target
#   already exists was merged: only the leftovers are deleted. Merging again gives the same
#   name (the run's target, the checkpoint id, the schema), so it never duplicates.

MANIFEST_PREFIX = ".compact-"


def manifest_name(checkpoint_id: int, token: str) -> str:
    return f"{MANIFEST_PREFIX}{checkpoint_id:010d}-{token}.json"


def manifest_checkpoint(name: str) -> int | None:
    if not name.startswith(MANIFEST_PREFIX):
        return None
    digits = name[len(MANIFEST_PREFIX):].split("-", 1)[0]
    return int(digits) if digits.isdigit() else None


def compact(directory: str, committables: list[dict], format: str) -> list[str]:
    """Merge compacted committables of one checkpoint (same `target`) into one file per schema;
    idempotent. Returns the URLs of the files now in place."""
    groups: dict[str, list[dict]] = {}
    for committable in sorted(committables, key=lambda c: c["inprogress"]):
        if filesystem.exists(committable["inprogress"]):
            groups.setdefault(_schema_key(committable["inprogress"], format), []).append(committable)
        else:   # merged before (its target is in place); only leftovers may remain
            delete_quietly_missing(committable.get("segments", []))
    placed = []
    for key, members in sorted(groups.items()):
        name = f"{members[0]['target']}-{hashlib.sha1(key.encode()).hexdigest()[:8]}.{format}"
        final = filesystem.join(directory, name)
        sources = [m["inprogress"] for m in members]
        if not filesystem.exists(final):
            hidden = filesystem.join(directory, ".inprogress-" + name)
            combine(sources, hidden, format)
            fs, path = filesystem.filesystem(hidden)
            fs.mv(path, filesystem.filesystem(final)[1])
        delete_quietly_missing(sources + [s for m in members for s in m.get("segments", [])])
        placed.append(final)
    return placed


def _schema_key(url: str, format: str) -> str:
    if format != "parquet":
        return ""
    with filesystem.open_read(url) as f:
        return pq.read_schema(f).to_string()


def write_manifest(directory: str, checkpoint_id: int, token: str, committables: list[dict]) -> None:
    with filesystem.open_write(filesystem.join(directory, manifest_name(checkpoint_id, token))) as f:
        f.write(json.dumps(committables).encode())


def compact_completed(directory: str, checkpoint_id: int, format: str) -> list[str]:
    """Subtask 0 at commit `checkpoint_id`: merge what the manifests of this and earlier (aborted)
    checkpoints name, then delete those manifests. Returns the files put in place."""
    fs, root = filesystem.filesystem(directory)
    fs.invalidate_cache(root)
    manifests = sorted(p for p in fs.ls(root, detail=False)
                       if (c := manifest_checkpoint(posixpath.basename(p))) is not None and c <= checkpoint_id)
    by_target: dict[str, list[dict]] = {}
    for path in manifests:
        with fs.open(path, "rb") as f:
            for committable in json.loads(f.read()):
                by_target.setdefault(committable["target"], []).append(committable)
    placed = []
    for target in sorted(by_target):
        placed += compact(directory, by_target[target], format)
    for path in manifests:
        fs.rm(path)
    return placed
