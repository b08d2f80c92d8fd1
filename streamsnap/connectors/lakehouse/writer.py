"""The writer side of a lakehouse sink's commit protocol (one per subtask; see committer.py).

It writes data files as the stream flows (`data_files.py`), and at each barrier closes them and
sends their descriptions to the sink's global committer before acknowledging the checkpoint;
its operator state keeps every file not yet known committed, which a restore hands back.
"""

from __future__ import annotations

from streamsnap.connectors.base import SinkWriter
from streamsnap.connectors.lakehouse.committer import NO_CHECKPOINT, application_id
from streamsnap.connectors.lakehouse.data_files import DataFileWriter, file_prefix
from streamsnap.runtime.batches import Batch, num_rows, to_record_batch
from streamsnap.runtime.operators.base import OperatorContext


class LakeWriter(SinkWriter):
    """Writes a subtask's data files; pre-commits them to the global committer at each barrier.

    Its operator state holds every file not yet known committed (committed = a completed
    checkpoint's notification reached it): what a restore hands back to the committer."""

    def __init__(self, ctx: OperatorContext, root: str, partition_by: list[str], convert, target_file_size: int,
                 partition_columns_in_files: bool = False):
        self._ctx = ctx
        self._token = f"-{ctx.run_id or ctx.job_id[:12]}-a{ctx.attempt}-"
        self._app_id = application_id(ctx.job_id, ctx.uid, ctx.run_id)
        self._files = DataFileWriter(root, partition_by, f"{file_prefix(ctx.uid)[:-1]}{self._token}s{ctx.subtask_index}-",
                                     convert, target_file_size, partition_columns_in_files)
        self._pending: list[dict] = []

    def _send(self, op: str, **fields) -> None:
        self._ctx.driver.send({"type": "sink", "uid": self._ctx.uid, "op": op,
                               "subtask": self._ctx.subtask_index, **fields})

    def write(self, batch: Batch) -> None:
        if num_rows(batch):
            self._files.write(to_record_batch(batch))

    def _precommit(self, checkpoint_id: int) -> None:
        files = [dict(f, checkpoint_id=checkpoint_id, app_id=self._app_id) for f in self._files.close_all()]
        # Before the acknowledgement (same connection): the committer has them when n completes.
        self._send("precommit", checkpoint_id=checkpoint_id, files=files)
        self._pending.extend(files)

    def prepare_commit(self, checkpoint_id: int) -> list:
        self._precommit(checkpoint_id)
        return [dict(f) for f in self._pending]

    def commit(self, checkpoint_id: int) -> None:
        self._pending = [f for f in self._pending if f["checkpoint_id"] > checkpoint_id]

    def end_input(self) -> None:
        if not self._ctx.extra.get("checkpointing"):
            self._precommit(NO_CHECKPOINT)   # committed when the job finishes

    def recover(self, committables: list) -> None:
        # Union state: every subtask has all of them; one hands them over, with the current
        # attempt's token so the cleanup spares the files this attempt is writing.
        if self._ctx.subtask_index == 0:
            self._send("recover", checkpoint_id=self._ctx.restored_checkpoint_id, files=committables,
                       token=self._token)

    def close(self) -> None:
        self._files.abandon()
