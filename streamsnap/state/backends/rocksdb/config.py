"""RocksDBConfig (memory, disk, snapshot strategy, compaction) and opening a database with it."""

from __future__ import annotations

import os
from dataclasses import dataclass

from streamsnap.errors import ConfigurationError
from streamsnap.state.backends.changelog import ChangelogConfig, check_config


MIB = 1 << 20
LEVEL_BASE = 64 * MIB           # see _open_db
TARGET_FILE_SIZE = 8 * MIB
COMPACTION_STYLES = ("universal", "level")
# Universal compaction: rewrite the bottom run once the newer runs add up to this share of it
# (RocksDB's default; with 100 the bottom run was rewritten within 80 checkpoints of 1 % of
# the keys, not with 200: 3.8 % of the live state uploaded per checkpoint on average instead of
# 3.0 %, at about the same full size — benchmarks/rocksdb_compaction.py);
# merge at least this many runs at a time (fewer, larger rewrites of the recent flushes).
_MAX_SPACE_AMPLIFICATION_PERCENT = 200
_MIN_MERGE_WIDTH = 4
DIRECTORY_PREFIX = "streamsnap-rocksdb-p"     # + "<pid>-<operator>-kg<first key group>-<random>"


# ---------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class RocksDBConfig:
    """Memory and disk of the RocksDB state backend, per operator subtask.

    block_cache_size: bytes of the LRU block cache (data, index and filter blocks) — the
      bound on RocksDB's read memory.
    write_buffer_size: bytes of one memtable; with `max_write_buffers` the bound on write memory
      (write_buffer_size × max_write_buffers).
    max_write_buffers: memtables kept before writes wait for a flush (>= 2 so one can flush
      while the other fills).
    local_dir: directory under which each subtask's database directory is created (it must be
      on a local disk); None: the system temp directory.
    incremental: checkpoints upload only the SST files not uploaded before (native RocksDB
      checkpoints, shared files reference-counted by the coordinator); False: every checkpoint
      is a full canonical snapshot. Savepoints are always full.
    write_cache_size: bytes of the write-back cache of entries in front of RocksDB (Python
      objects, counted approximately: see `write_cache`); hot keys' reads and writes stay in it
      and reach RocksDB in one write batch when it overflows and at every snapshot. 0: no
      cache, every write goes to RocksDB at once.
    changelog: True or a `ChangelogConfig`: every state write is also logged, a checkpoint
      uploads only the log since the last one, RocksDB is materialized in the background
      (`streamsnap.state.backends.changelog`); needs incremental=True.
    compaction: "universal" (the default) or "level", RocksDB's compaction style.
      Incremental checkpoints upload each checkpoint's flush (about what changed) plus the
      files compactions rewrote since the last one. Under updates spread over the key space
      every compaction into the large bottom run rewrites all of it; leveled compaction does
      so every `level0_compaction_trigger` flushes, universal compaction merges the flushes
      among themselves (runs of similar size) and rewrites the bottom run only once the
      newer runs add up to twice its size (space amplification bounded at 3x; in practice the
      merges of the newer runs keep it far lower). 1 % of 5 M keys (50.6 MB) updated per
      checkpoint, 80 checkpoints: universal 1.51 MB per checkpoint (3.0 % of the live state;
      full size 60 MB on average, 79 at most), leveled 2.94 MB (5.8 %), at the same CPU for
      the reads and writes (`benchmarks/rocksdb_compaction.py`).
    level0_compaction_trigger: flushes (level-0 files; sorted runs with universal
      compaction) that pile up before a compaction merges them. Larger: fewer rewrites, so
      smaller uploads on average; the price is disk space and a bloom-filter check per
      level-0 file on every read. RocksDB's default is 4; with leveled compaction 16 uploaded
      a third of what 4 did for 1 % of the keys changed per checkpoint, 32 halved 16's
      uploads again but made reads ~10 % (at worst ~1.8x) slower.
    """

    block_cache_size: int = 64 * MIB
    write_buffer_size: int = 16 * MIB
    max_write_buffers: int = 2
    local_dir: str | None = None
    incremental: bool = True
    write_cache_size: int = 16 * MIB
    changelog: ChangelogConfig | bool | None = None
    level0_compaction_trigger: int = 16
    compaction: str = "universal"

    def __post_init__(self):
        if not isinstance(self.incremental, bool):
            raise ConfigurationError(f"RocksDBConfig.incremental must be True or False, got "
                                     f"{self.incremental!r}")
        object.__setattr__(self, "changelog", check_config(self.changelog))
        if self.changelog is not None and not self.incremental:
            raise ConfigurationError("RocksDBConfig.changelog needs incremental=True: its "
                                     "materializations are incremental RocksDB snapshots")
        for name, minimum in (("block_cache_size", 64 * 1024), ("write_buffer_size", 64 * 1024),
                              ("max_write_buffers", 2), ("level0_compaction_trigger", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigurationError(
                    f"RocksDBConfig.{name} must be an integer >= {minimum}, got {value!r}")
        if self.compaction not in COMPACTION_STYLES:
            raise ConfigurationError(f"RocksDBConfig.compaction must be one of "
                                     f"{', '.join(map(repr, COMPACTION_STYLES))}, got {self.compaction!r}")
        size = self.write_cache_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ConfigurationError(f"RocksDBConfig.write_cache_size must be an integer >= 0 "
                                     f"(bytes; 0 turns the write cache off), got {size!r}")
        if self.local_dir is not None and (not isinstance(self.local_dir, (str, os.PathLike))
                                           or not str(self.local_dir).strip()):
            raise ConfigurationError(
                f"RocksDBConfig.local_dir must be a local directory path or None, got "
                f"{self.local_dir!r}")

    @property
    def memory_bound(self) -> int:
        """Bytes the backend may hold in memory for one subtask (block cache + memtables +
        write cache)."""
        return (self.block_cache_size + self.write_buffer_size * self.max_write_buffers
                + self.write_cache_size)


def import_rocksdict():
    """The `rocksdict` module, or a ConfigurationError saying how to install it."""
    try:
        import rocksdict
    except ImportError as e:
        raise ConfigurationError(
            f"state_backend='rocksdb' needs the rocksdict package (RocksDB for Python), which "
            f"cannot be imported here ({e}); install it with pip install 'rocksdict>=0.3.29' on "
            f"the driver and every Spark executor, or use state_backend='hashmap'") from e
    return rocksdict


def _open_db(path: str, config: RocksDBConfig):
    rocksdict = import_rocksdict()
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_write_buffer_size(config.write_buffer_size)
    options.set_max_write_buffer_number(config.max_write_buffers)
    # Incremental checkpoints upload the SST files written since the last one: each checkpoint
    # flushes its changes into one new level-0 file, and compactions rewrite older files. With
    # leveled compaction (`compaction="level"`; universal below, the default), under
    # updates spread over the key space every level-0 file overlaps every file below it, so each
    # compaction into a level rewrites all of it. Letting `level0_compaction_trigger` flushes
    # pile up in level 0 and merging them into the level below in one compaction makes most
    # uploads the flush alone, with one rewrite of the state every trigger flushes. 1 % of 5 M
    # keys changed per checkpoint, mean upload per checkpoint / 50 K sorted random multi-get
    # (one run, machine loaded): trigger 4: 22.9 % / 519 ms, 8: 10.8 % / 710 ms, 16: 7.5 % /
    # 571 ms, 32: ~3 % / 940 ms (median 1.1-1.8 % for all): reads check every level-0 file's
    # bloom filter, so the trigger trades uploads for reads. Level 0 also compacts once it
    # holds more than the 64 MiB first level (a bulk load's full memtables do not pile up),
    # and levels are sized from the bottom up, so a subtask's state up to ~640 MiB sits in one
    # level below level 0 (target file size 8 MiB).
    trigger = config.level0_compaction_trigger
    options.set_level_zero_file_num_compaction_trigger(trigger)
    options.set_level_zero_slowdown_writes_trigger(max(20, trigger + trigger // 2))
    options.set_level_zero_stop_writes_trigger(max(36, 2 * trigger))
    options.set_level_compaction_dynamic_level_bytes(True)
    options.set_max_bytes_for_level_base(LEVEL_BASE)
    options.set_target_file_size_base(TARGET_FILE_SIZE)
    if config.compaction == "universal":
        # See RocksDBConfig.compaction. `python -m benchmarks.rocksdb_compaction` (5 M keys,
        # 50.6 MB loaded, 1 % changed per checkpoint, 80 checkpoints, trigger 16): mean upload
        # per checkpoint 1.51 MB universal (0.54 flush + 0.96 compaction output; 1.92 MB with a
        # space-amplification bound of 100 %) against 2.94 MB leveled (0.54 + 2.39); full size
        # 60 MB on average (max 79) against 43.7 MB (max 54). A leveled trigger of 32 uploaded
        # 2.0 MB at ~10 % more CPU per interval (another run).
        universal = rocksdict.UniversalCompactOptions()
        universal.max_size_amplification_percent = _MAX_SPACE_AMPLIFICATION_PERCENT
        universal.min_merge_width = _MIN_MERGE_WIDTH
        options.set_compaction_style(rocksdict.DBCompactionStyle.universal())
        options.set_universal_compaction_options(universal)
    table = rocksdict.BlockBasedOptions()
    cache = rocksdict.Cache(config.block_cache_size)
    table.set_block_cache(cache)
    # Index and filter blocks live in the block cache, so memory stays bounded by it; they are
    # partitioned (two-level) because whole ones grow with the file (a 5 M-key file's bloom
    # filter is ~6 MiB) beyond a cache shard's share (the LRU cache has 64 shards), so each
    # lookup re-read them: random reads of 5 M keys went from 54 K to 198 K keys/s this way.
    # The small top levels stay pinned.
    table.set_cache_index_and_filter_blocks(True)
    table.set_bloom_filter(10, False)
    table.set_index_type(rocksdict.BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(4096)
    table.set_pin_top_level_index_and_filter(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    options.set_block_based_table_factory(table)
    db = rocksdict.Rdict(path, options)
    write_options = rocksdict.WriteOptions()
    write_options.disable_wal = True       # a working copy: recovery is from checkpoints
    db.set_write_options(write_options)
    return rocksdict, db, cache


__all__ = ["RocksDBConfig", "import_rocksdict"]
