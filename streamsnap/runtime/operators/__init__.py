"""Stream operators: what runs inside a task's chain, apart from the task machinery around it.

The task (`runtime/task.py`, its inputs, outputs, barriers and mailbox) builds each operator of
its chain from the `OperatorFactory` on the stream graph and drives it; the operators are here:

* `base.py` — the contract: `OperatorFactory`, `StreamOperator` (state backends, user-function
  hooks, checkpoint callbacks), `OperatorContext`, `Output`.
* `functions.py` — `map`, `filter`, `flat_map`, `map_batches`; `row_chain.py` fuses a run of
  chained per-row ones into one loop per batch.
* `process.py` — process functions, keyed or not, per row or per batch (`process_batches`);
  `keyed.py` — what keyed operators share: keys and key groups of a batch, processing time.
* `co_process.py` — two inputs (`connect(...).process`); `co_batch_process.py` — two keyed
  inputs a batch at a time (`connect(...).process_batches`); `broadcast.py` — broadcast state.
* `windows.py` — the window operator; `vectorized_windows.py` — windowed column aggregates.
* `window_join.py`, `interval_join.py` — the joins; `lookup_join.py` — a stream with a bounded
  table (`lookup_join`).
* `timestamps_and_watermarks.py` — `assign_timestamps_and_watermarks` and where a record's
  timestamp lives; `watermark_emitter.py` — watermarks where timestamps are assigned (that
  operator and the sources).
"""
