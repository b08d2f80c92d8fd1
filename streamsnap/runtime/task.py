"""A subtask running inside one Spark barrier task (Flink's Task + StreamTask).

Set-up: connect to the driver's control endpoint and register (pid, host, data port); receive
the peers' data addresses from the driver; connect outputs, wait for inputs; build the operator
chain, restore its state, open it; report RUNNING.

Then the mailbox loop, on one thread: run queued mails (checkpoint triggers, notifications,
finish, cancel), then one unit of default work — one input batch through the chain, or one
source batch — when every output has room; flush batches whose buffer timeout passed; sleep
on the mailbox otherwise. Checkpoints are performed in this thread (`perform_checkpoint`):
pre-barrier hook, barrier broadcast, synchronous snapshot; the asynchronous part (writing state
files) runs on a separate thread, which then acknowledges to the coordinator.

End of input follows Flink's final-checkpoint protocol (FLIP-147): a task whose input ended
emits EndOfData and reports it, but keeps taking part in checkpoints until the driver — after
a final checkpoint committed everything — tells it to finish; only then EndOfPartition flows
and the task exits. Without checkpointing it finishes right away.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import os
import socket
import time
import traceback

from streamsnap.checkpoint.handles import OperatorSubtaskState
from streamsnap.checkpoint.messages import AcknowledgeCheckpoint, CheckpointMetrics, DeclineCheckpoint
from streamsnap.checkpoint.reasons import CheckpointFailureReason
from streamsnap.checkpoint import storage_retry
from streamsnap.clock import SystemClock, TimerQueue
from streamsnap.errors import DataError, StreamsnapError, UserFunctionError
from streamsnap.graph.stream_graph import NodeKind
from streamsnap.network.channels import InputChannel, OutputChannel
from streamsnap.network.addresses import advertised_host, source_address
from streamsnap.network.control import connect_control
from streamsnap.network.debloat import BufferDebloater
from streamsnap.network.poller import ConnectionLost, DataServer, TaskNetwork, connect_output
from streamsnap.runtime.allocator import tune_allocator
from streamsnap.runtime.collector import freeze_after_setup, unfreeze_at_teardown
from streamsnap.runtime.aborted_ids import AbortedIds
from streamsnap.runtime.barriers import AlignmentMetrics
from streamsnap.runtime.deployment import Deployment
from streamsnap.runtime.events import (
    CancelCheckpointMarker, CheckpointBarrier, CheckpointOptions, CheckpointType, EndOfData, EndOfPartition,
    Watermark, WatermarkStatus,
)
from streamsnap.runtime.channel_state import overtake_outputs, queue_timeoutable_barrier, restore_channel_state
from streamsnap.runtime.input import CheckpointedInput, UpstreamLostError
from streamsnap.runtime.mailbox import Mailbox
from streamsnap.runtime.operators.base import OperatorContext, Output
from streamsnap.runtime import log_relay, schemas, trace
from streamsnap.runtime.output import RecordWriter
from streamsnap.runtime.operators.row_chain import fuse_row_chains
from streamsnap.runtime.task_time import TaskTimeAccount
from streamsnap.state.local_recovery import LocalRecoveryStore, default_root
from streamsnap.state.snapshot import SnapshotDiscardedError
from streamsnap.time.watermarks import MIN_WATERMARK

log = logging.getLogger(__name__)

SETUP_TIMEOUT = 120.0
_MAX_IDLE_WAIT = 0.5
ROW_CHUNK = 1024    # rows per input batch of a per-row head operator (runtime/input.py)


def _rocksdb_metrics(op) -> dict | None:
    """The operator's RocksDB native metrics (None: no keyed state on RocksDB)."""
    native = getattr(getattr(op, "keyed_backend", None), "native_metrics", None)
    return native() if native is not None else None


class TaskCancelled(Exception):
    """The driver cancelled the task, or the connection to the driver is gone."""


class AsyncCheckpointRunner:
    """One background thread running the asynchronous parts of snapshots, in order."""

    def __init__(self, name: str, on_error):
        self._on_error = on_error
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"{name}-async", daemon=True)
        self._thread.start()

    def submit(self, fn, *args) -> None:
        self._queue.put((fn, args))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except BaseException as exc:  # fail the task rather than stall its checkpoints
                log.exception("asynchronous checkpoint work failed")
                self._on_error(exc)
                return

    def shutdown(self, timeout: float) -> None:
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("an asynchronous snapshot was still running after %.0f s; abandoning it", timeout)


class DriverLink:
    """Messages from this subtask to the JobMaster, stamped with the execution attempt."""

    def __init__(self, connection, attempt_wire: list):
        self._connection = connection
        self._attempt = attempt_wire

    def send(self, message: dict) -> None:
        message["attempt"] = self._attempt
        if not self._connection.send(message):
            raise TaskCancelled("the connection to the driver is closed")


class StreamTask:
    def __init__(self, deployment: Deployment, task_index: int, host: str | None = None):
        self.deployment = deployment
        # The address peers reach this task at when it listens on every interface: the host
        # its executor advertises (None: the host this process's environment states, else this
        # machine's name; network/addresses.py).
        self.host = host or advertised_host(socket.gethostname())
        self.vertex = deployment.vertex(task_index)
        self.job_vertex = deployment.execution_graph.job_vertex(self.vertex.vertex_id)
        self.attempt_id = deployment.attempt_id(task_index)
        # The chain's head operator: its state also carries the task's in-flight data.
        self.head_uid = deployment.execution_graph.job_graph.node(self.job_vertex.head).uid
        self.name = f"{self.job_vertex.name} ({self.vertex.index + 1}/{self.vertex.parallelism})"
        self.clock = SystemClock()
        # Processing-time callbacks of the operators (timers, periodic watermarks), run by the
        # mailbox loop between units of work — never from another thread.
        self.timers = TimerQueue(self.clock)
        # A terminating savepoint this task took part in: until it is aborted, no processing-time
        # callback runs (their output would follow the savepoint's barrier and be lost to it).
        self._quiesced_by: int | None = None
        self.network = TaskNetwork(self.name)
        self.mailbox = Mailbox(self.network.wake)
        self.cancelled = False
        self._control = None
        self._log_relay = None     # runtime.log_relay: this process's records, to the driver
        self.driver: DriverLink | None = None
        self._server: DataServer | None = None
        self._input: CheckpointedInput | None = None
        self._inputs: list[InputChannel] = []
        self._outputs: list[OutputChannel] = []
        self.writers: list[RecordWriter] = []
        self.operators: list = []          # topological order, head first
        self.head = None
        self._two_inputs = False
        self._async: AsyncCheckpointRunner | None = None
        self._peers: dict | None = None
        self._background_error: BaseException | None = None
        self._end_of_data = False
        self._finish_requested = False
        self._drain = True
        self._eop_sent = False
        self._outputs_shut = False
        # A source stopped by a terminating savepoint's barrier: that savepoint's id. Only its
        # abort resumes the source; other checkpoints' aborts do not concern it.
        self._suspended_by: int | None = None
        # Aborted before they started here (bounded: runtime/aborted_ids.py).
        self._aborted_checkpoints = AbortedIds()
        # Snapshots whose asynchronous part has not finished, per checkpoint: an abort or a
        # cancellation discards them, so nothing is written after the coordinator gave up.
        self._in_flight: dict[int, list] = {}
        self._in_flight_lock = threading.Lock()
        self._source_wait = 0.0
        # The earliest deadline of a timeout-able barrier still queued on an output, if any.
        self._barrier_deadline: float | None = None
        # Idle / backpressured / busy time of the running loop (runtime/task_time.py).
        self.time_account: TaskTimeAccount | None = None
        self._debloater: BufferDebloater | None = None     # NetworkConfig(debloat_target=...)
        # The event time the head operator was last told (its currentInputWatermark).
        self._head_input_watermark = MIN_WATERMARK
        self._upstream_of: dict[str, object] = {}   # chained operator uid -> the operator feeding it
        self._hooks = deployment.test_hooks or {}
        # Task-local recovery: the local copies of this subtask's keyed snapshots.
        self.local_store = None
        if deployment.local_recovery:
            self.local_store = LocalRecoveryStore(deployment.local_recovery_dir or default_root(),
                                                  deployment.job_id)

    # ================================================================== set-up
    def _on_control_message(self, _conn, message: dict) -> None:
        kind = message.get("type")
        if kind == "report_metrics":   # monitoring (streamsnap/web): counters only, off the mailbox
            try:
                self.driver.send({"type": "metrics", "metrics": self.metrics()})
            except TaskCancelled:
                log.debug("%s: counters not reported, the driver is gone", self.name)
            return
        if kind == "cancel":
            self.cancelled = True
        self.mailbox.put(message)

    def _on_control_close(self, _conn, error) -> None:
        if not self._eop_sent or not self._all_drained():
            self.cancelled = True
        self.mailbox.put({"type": "driver_lost"})

    def _on_background_error(self, exc: BaseException) -> None:
        """The async-snapshot thread failed: the mailbox thread fails the task."""
        self._background_error = exc
        self.network.wake()

    def setup(self) -> None:
        d = self.deployment
        network = d.network
        self._inputs = [InputChannel(i, cid, network.credits) for i, cid in enumerate(self.vertex.inputs)]
        if self._inputs:
            self._server = DataServer(d.bind_host, d.secret, self.name,
                                      {ch.channel_id: ch for ch in self._inputs}, self.network,
                                      network.peer_timeout)
            self._server.start()
        self._control = connect_control(d.driver_address, d.secret, self.name,
                                        self._on_control_message, self._on_control_close,
                                        source=source_address(self.host), peer_timeout=network.peer_timeout)
        self.driver = DriverLink(self._control, self.attempt_id.to_wire())
        self._log_relay = log_relay.install(self.driver.send, d.log_level, self.job_vertex.name,
                                            self.vertex.index, self.vertex.parallelism, self.host, os.getpid(),
                                            echo=d.echo_logs)
        self.driver.send({"type": "register", "task_index": self.vertex.task_index, "pid": os.getpid(),
                          "host": self.host, "data_address": self._data_address()})
        self._await_peers()
        self._connect_outputs()
        self._await_inputs()
        self._restore_channel_state()
        self._build_chain()
        if self._input is not None and self.head.row_input:
            self._input.chunk_for_rows(ROW_CHUNK)
        for op in self.operators:
            op.initialize_state()
        for op in reversed(self.operators):
            op.open()
        self._async = AsyncCheckpointRunner(self.name, self._on_background_error)
        running = {"type": "running"}
        if self.local_store is not None:
            # What the restore read from local copies and from checkpoint storage.
            running["local_recovery"] = self.local_store.metrics()
        self.driver.send(running)

    def _data_address(self) -> list | None:
        if self._server is None:
            return None
        bound, port = self._server.address
        return [bound if bound not in ("", "0.0.0.0") else self.host, port]

    def _await_peers(self) -> None:
        deadline = time.monotonic() + SETUP_TIMEOUT
        deferred = []
        while self._peers is None:
            for mail in self.mailbox.take_all():
                if mail.get("type") == "peers":
                    self._peers = {int(k): tuple(v) for k, v in mail["addresses"].items()}
                elif mail.get("type") in ("cancel", "driver_lost"):
                    raise TaskCancelled("cancelled during set-up")
                else:
                    deferred.append(mail)  # handled once the loop runs
            if self._peers is None:
                if self.cancelled or time.monotonic() > deadline:
                    raise TaskCancelled("no peer addresses from the driver")
                self.network.poll(0.5)
        for mail in deferred:
            self.mailbox.put(mail)

    def _connect_outputs(self) -> None:
        d = self.deployment
        for gate in self.vertex.outputs:
            channels = []
            for channel_id, target in zip(gate.channels, gate.target_tasks):
                channel = OutputChannel(len(self._outputs), channel_id, d.network.output_queue_frames)
                sock = connect_output(self._peers[target], d.secret, channel_id, source_address(self.host),
                                      d.network.peer_timeout)
                self.network.add_output(sock, channel)
                self._outputs.append(channel)
                channels.append(channel)
            node = d.execution_graph.job_graph.node(gate.source_node)
            # Rows become Arrow here, checked by the schema rule (runtime/schemas.py); a side
            # output's schema is inferred.
            schema = schemas.for_output(node, self.name, gate.tag)
            self.writers.append(RecordWriter(gate, channels, self.vertex.index,
                                             d.network.batch_size, d.network.buffer_timeout, schema))

    def _await_inputs(self) -> None:
        deadline = time.monotonic() + SETUP_TIMEOUT
        for channel in self._inputs:
            while not channel.connected.wait(0.2):
                if self.cancelled or self._background_error or time.monotonic() > deadline:
                    raise TaskCancelled(f"upstream {channel.channel_id} never connected")
        if self._inputs:
            self._input = CheckpointedInput(self._inputs, self.network, self, self.deployment.exactly_once,
                                            self.clock, self.name, self.vertex.input_of,
                                            max_rows=self.deployment.network.merge_limit,
                                            unaligned=self.deployment.unaligned_checkpoints)
            network = self.deployment.network
            if network.debloat_target is not None:
                self._debloater = BufferDebloater(network.debloat_target, len(self._inputs),
                                                  network.credits + network.output_queue_frames,
                                                  network.batch_size)

    def _restore_channel_state(self) -> None:
        """In-flight data of the unaligned checkpoint restored: in front of the channels,
        before any operator runs."""
        d = self.deployment
        restore = d.restore.get((self.head_uid, self.vertex.index))
        if restore is not None and restore.channel:
            restored = restore_channel_state(restore.channel, d.restore_base, d.restored_checkpoint_id,
                                             self.name, self._inputs, self._outputs)
            log.info("%s: restored %d bytes of in-flight data", self.name, restored)

    def _build_chain(self) -> None:
        d = self.deployment
        graph = d.execution_graph.job_graph
        created = {}
        for node_id in reversed(self.job_vertex.nodes):
            node = graph.node(node_id)
            ctx = OperatorContext(
                name=node.name, uid=node.uid, subtask_index=self.vertex.index,
                parallelism=self.vertex.parallelism, max_parallelism=node.max_parallelism,
                attempt=d.attempt, job_id=d.job_id, run_id=d.run_id, task_name=self.name,
                state_backend=d.state_backend, restore=d.restore.get((node.uid, self.vertex.index)),
                restore_base=d.restore_base, restored_operator=node.uid in d.restored_operators,
                restored_checkpoint_id=d.restored_checkpoint_id, driver=self.driver,
                extra={"checkpointing": d.checkpointing}, timers=self.timers, clock=self.clock,
                local_store=self.local_store)
            op = node.operator.create(ctx)
            targets, side = [], {}
            tags = self.job_vertex.chained_tags
            for c in self.job_vertex.chained.get(node_id, []):
                self._upstream_of[graph.node(c).uid] = op
                (side.setdefault(tags[c], []) if c in tags else targets).append(created[c])
            for w in self.writers:
                if w.gate.source_node == node_id:
                    (targets if w.gate.tag is None else side.setdefault(w.gate.tag, [])).append(w)
            op.output = Output(targets, side)
            created[node_id] = op
        self.operators = [created[n] for n in self.job_vertex.nodes]
        # Chained map / filter / flat_map operators run as one loop per batch.
        fuse_row_chains(self.operators)
        self.head = created[self.job_vertex.head]
        self.is_source = graph.node(self.job_vertex.head).kind is NodeKind.SOURCE
        # A two-input head (connect, joins) is told which logical input each batch came from.
        self._two_inputs = bool(getattr(self.head, "two_inputs", False))

    # ================================================================== main loop
    def run(self) -> None:
        network = self.network
        account = self.time_account = TaskTimeAccount(time.monotonic())
        if self.deployment.finish_at_restore:
            self._finish_at_restore()
        while True:
            for mail in self.mailbox.take_all():
                self._handle_mail(mail)
            if self.cancelled:
                raise TaskCancelled("cancelled")
            if self._background_error is not None:
                raise self._background_error
            if self._input is not None and self._input.unaligned:
                self._input.poll_priority()
            outputs_available = self._outputs_available()
            worked = self._step() if outputs_available else False
            now = time.monotonic()
            if self._debloater is not None and self._debloater.due(now):
                self._debloat(now)
            if self._barrier_deadline is not None and self._barrier_deadline <= now:
                self._convert_due_barriers(now)
            deadline = self._barrier_deadline
            for writer in self.writers:
                due = writer.flush_due(now)
                if due is not None and (deadline is None or due < deadline):
                    deadline = due
            if self._finished():
                return
            if worked or self.mailbox.has_mail():
                network.poll(0.0)  # send what this step queued, take in what arrived
                continue
            timeout = _MAX_IDLE_WAIT
            if deadline is not None:
                timeout = min(timeout, max(0.0, deadline - now))
            if self._source_wait:
                timeout = min(timeout, self._source_wait)
            align_due = self._input.alignment_deadline() if self._input is not None else None
            if align_due is not None:
                timeout = min(timeout, max(0.0, align_due - now))
            # A due timer runs in _step, which waits for output capacity: while backpressured,
            # waiting for the timer would spin on poll(0); credit or a sent frame wakes the poll.
            timer_due = self.timers.next_due() if outputs_available and self._timers_may_run() else None
            if timer_due is not None:
                timeout = min(timeout, max(0.0, timer_due - now))
            # Waiting with a full output is backpressure; with room, it is waiting for input.
            account.begin_wait(now, not outputs_available)
            network.poll(timeout)
            account.end_wait(time.monotonic())

    def _convert_due_barriers(self, now: float) -> None:
        """Aligned barriers still queued at their deadline overtake the output ahead of them."""
        for writer in self.writers:
            writer.convert_due_barriers(now)
        self._barrier_deadline = min((d for w in self.writers if (d := w.barrier_deadline()) is not None),
                                     default=None)

    def _debloat(self, now: float) -> None:
        """Buffer debloating: from the rows consumed per busy second, the frame size senders cut."""
        rows = self._debloater.update(now, self.head.records_in, self.time_account.reading(now)["idle"])
        if rows is not None:
            self.network.announce_frame_rows(rows)

    def _outputs_available(self) -> bool:
        for writer in self.writers:
            if not writer.is_available():
                return False
        return True

    def _timers_may_run(self) -> bool:
        """Processing-time callbacks stop at end of data (nothing may follow EndOfData) and
        after a terminating savepoint, unless that savepoint was aborted."""
        if self._end_of_data or self.deployment.finish_at_restore:
            return False
        return self._quiesced_by is None

    def _step(self) -> bool:
        self._source_wait = 0.0
        due = self.timers.next_due()
        if due is not None and due <= self.clock.monotonic() and self._timers_may_run():
            self.timers.run_due()
            return True
        if self.is_source:
            if self._suspended_by is not None or self._end_of_data:
                return False
            if self.head.emit_next():
                return True
            if self.head.reader.is_finished():
                self._on_end_of_data()
                return True
            self._source_wait = self.head.reader.next_available_in()
            return False
        item = self._input.poll_next()
        if item is not None:
            if type(item) is Watermark:   # the input's combined watermark advanced
                self._head_input_watermark = item.timestamp
                self.head.process_watermark(item.timestamp)
            elif isinstance(item, WatermarkStatus):
                self.head.process_watermark_status(item)
            elif self._two_inputs:
                self.head.process_input(self._input.last_input, item)
            else:
                self.head.process(item)
            return True
        if self._input.all_end_of_data and not self._end_of_data:
            self._on_end_of_data()
            return True
        return False

    def _on_end_of_data(self) -> None:
        self._end_of_data = True
        drain = self._drain and (self._input is None or self._input.drain)
        if drain and self.is_source:
            # Bounded input ended (or a draining stop): event time ends, every timer fires.
            self.head.advance_to_end_of_time()
        if drain:
            for op in self.operators:
                op.end_input()
        for writer in self.writers:
            writer.broadcast_event(EndOfData(drain))
        self.driver.send({"type": "end_of_data"})
        if not self.deployment.checkpointing:
            self._finish_requested = True

    def _finish_at_restore(self) -> None:
        """The restored savepoint drained: its operators restored (sinks committed what it covers),
        they finish without reading input, firing timers or flushing (Flink's finished-on-restore)."""
        self._finish_requested = True
        self._drain = False
        if self.is_source:
            self._on_end_of_data()

    def _finished(self) -> bool:
        if not self._finish_requested:
            return False
        if self._input is not None and not self._input.all_end_of_partition:
            return False
        if not self._eop_sent:
            for writer in self.writers:
                writer.broadcast_event(EndOfPartition())
            self._eop_sent = True
            self.network.flush()
        if not self._all_drained():
            return False
        if not self._outputs_shut:
            self.network.shutdown_outputs()
            self._outputs_shut = True
        return self.network.outputs_closed()

    def _all_drained(self) -> bool:
        return all(w.is_drained() for w in self.writers)

    def _handle_mail(self, mail: dict) -> None:
        kind = mail.get("type")
        if kind == "trigger_checkpoint":
            options = CheckpointOptions.from_wire(mail["options"])
            start_delay = max(0.0, self.clock.wall() - float(mail["timestamp"]))
            if mail.get("drain") and self.is_source:
                # A draining stop-with-savepoint: event time ends before the savepoint's barrier,
                # so every timer fires and its output is covered by the savepoint.
                self.head.advance_to_end_of_time()
            self.perform_checkpoint(int(mail["checkpoint_id"]), float(mail["timestamp"]), options,
                                    AlignmentMetrics(0.0, 0, start_delay))
            self._quiesce_if_terminating(int(mail["checkpoint_id"]), options)
        elif kind == "notify_complete":
            checkpoint_id = int(mail["checkpoint_id"])
            marker = self._phase("commit", checkpoint_id)
            delay = self._hooks.get("notify_delay")
            if delay:
                time.sleep(float(delay))
            for op in self.operators:
                op.notify_checkpoint_complete(checkpoint_id)
            self._phase_done(marker)
        elif kind == "notify_aborted":
            checkpoint_id = int(mail["checkpoint_id"])
            self._aborted_checkpoints.add(checkpoint_id)
            self._discard_in_flight(checkpoint_id)
            if self._input is not None:
                self._input.handler.on_checkpoint_aborted(checkpoint_id)
            if self._suspended_by == checkpoint_id:
                self._suspended_by = None  # the terminating savepoint failed: keep going
            if self._quiesced_by == checkpoint_id:
                self._quiesced_by = None
            for op in self.operators:
                op.notify_checkpoint_aborted(checkpoint_id)
        elif kind == "finish":
            self._finish_requested = True
            self._drain = bool(mail.get("drain", True))
            if self.is_source and not self._end_of_data:
                self._on_end_of_data()
        elif kind in ("cancel", "driver_lost"):
            if kind == "cancel" or not self._eop_sent:
                raise TaskCancelled(kind)
        elif kind == "peers":
            log.debug("%s: duplicate peers message ignored", self.name)
        else:
            raise StreamsnapError(f"{self.name}: unknown control message {kind!r}")

    # ================================================================== test hooks
    def _phase(self, name: str, checkpoint_id: int):
        """Test hook: a marker file naming this process while it is in a checkpoint phase.

        Only with STREAMSNAP_TEST_HOOKS={"phase_dir": ...}; lets failure tests SIGKILL a
        task exactly in its asynchronous phase or between checkpoint completion and commit.
        """
        directory = self._hooks.get("phase_dir")
        if not directory:
            return None
        vertex = self.vertex.vertex_id.replace("/", "_")
        path = os.path.join(directory, f"{name}-{vertex}-{self.vertex.index}-{checkpoint_id}-{os.getpid()}")
        with open(path, "w"):
            pass
        return path

    @staticmethod
    def _phase_done(path) -> None:
        if path is not None and os.path.exists(path):
            os.unlink(path)

    # ================================================================== checkpoints
    def trigger_checkpoint_on_barrier(self, barrier: CheckpointBarrier, metrics: AlignmentMetrics,
                                      recording=None) -> None:
        self.perform_checkpoint(barrier.checkpoint_id, barrier.timestamp, barrier.options, metrics, recording)
        self._quiesce_if_terminating(barrier.checkpoint_id, barrier.options)

    def _quiesce_if_terminating(self, checkpoint_id: int, options: CheckpointOptions) -> None:
        if options.checkpoint_type is CheckpointType.TERMINATING_SAVEPOINT \
                and checkpoint_id not in self._aborted_checkpoints:
            self._quiesced_by = checkpoint_id

    def abort_checkpoint_on_barrier(self, checkpoint_id: int, reason: CheckpointFailureReason) -> None:
        self._discard_in_flight(checkpoint_id)   # an unaligned snapshot given up after it was taken
        self._decline(checkpoint_id, reason, "")
        for writer in self.writers:
            writer.broadcast_event(CancelCheckpointMarker(checkpoint_id))

    def _decline(self, checkpoint_id: int, reason: CheckpointFailureReason, detail: str) -> None:
        decline = DeclineCheckpoint(self.attempt_id, checkpoint_id, reason, detail)
        self.driver.send({"type": "decline", **decline.to_wire()})

    def perform_checkpoint(self, checkpoint_id: int, timestamp: float, options: CheckpointOptions,
                           metrics: AlignmentMetrics, recording=None) -> None:
        if self._eop_sent:
            self._decline(checkpoint_id, CheckpointFailureReason.CHECKPOINT_DECLINED_TASK_CLOSING,
                          f"{self.name} is finishing")
            return
        self._aborted_checkpoints.forget_below(checkpoint_id)
        if checkpoint_id in self._aborted_checkpoints:
            # Aborted before we got to it: tell downstream not to wait for our barrier.
            for writer in self.writers:
                writer.broadcast_event(CancelCheckpointMarker(checkpoint_id))
            return
        started = time.monotonic()
        for op in self.operators:
            op.prepare_snapshot_pre_barrier(checkpoint_id)
        barrier = CheckpointBarrier(checkpoint_id, timestamp, options)
        # Unaligned: the barrier overtakes the queued output, which becomes channel state. A
        # source goes unaligned at once unless the checkpoint starts aligned (aligned_timeout).
        unaligned = metrics.unaligned or (self.is_source and options.unaligned and not options.aligned_timeout)
        channel_snapshot = None
        if unaligned:
            channel_snapshot = overtake_outputs(checkpoint_id, options.target_location, self.head_uid,
                                                self.writers, barrier, self._inputs, recording)
        elif options.unaligned and options.aligned_timeout and self.writers:
            # Aligned so far; the timeout counts from the checkpoint's start (its timestamp),
            # so a barrier its output queues hold until then overtakes what is ahead of it.
            deadline = self.clock.monotonic() + timestamp + options.aligned_timeout - self.clock.wall()
            channel_snapshot = queue_timeoutable_barrier(checkpoint_id, options.target_location, self.head_uid,
                                                         self.writers, barrier, deadline)
            if self._barrier_deadline is None or deadline < self._barrier_deadline:
                self._barrier_deadline = deadline
        else:
            for writer in self.writers:
                writer.broadcast_event(barrier)
        # Discarded together when the checkpoint is given up.
        discardable = [channel_snapshot] if channel_snapshot else []
        snapshots = []
        try:
            if options.checkpoint_type is CheckpointType.TERMINATING_SAVEPOINT:
                for op in self.operators:
                    op.prepare_stop(checkpoint_id)
            for op in self.operators:
                snapshots.append(op.snapshot_state(checkpoint_id, timestamp, options.target_location))
        except UserFunctionError:
            raise
        except Exception as exc:
            for snapshot in snapshots + discardable:
                snapshot.discard()
            log.warning("%s: synchronous snapshot of checkpoint %d failed", self.name, checkpoint_id, exc_info=True)
            self._decline(checkpoint_id, CheckpointFailureReason.TASK_CHECKPOINT_FAILURE, repr(exc))
            return
        sync_duration = time.monotonic() - started
        if options.checkpoint_type is CheckpointType.TERMINATING_SAVEPOINT and self.is_source:
            self._suspended_by = checkpoint_id
        with self._in_flight_lock:
            self._in_flight[checkpoint_id] = snapshots + discardable
        self._async.submit(self._complete_async, checkpoint_id, snapshots, sync_duration, metrics,
                           options.target_location, channel_snapshot)

    def _discard_in_flight(self, checkpoint_id: int | None = None) -> None:
        """Discard the snapshots of one checkpoint (or all): each deletes whatever it wrote,
        now or when its running write notices."""
        with self._in_flight_lock:
            doomed = ([self._in_flight.pop(checkpoint_id, [])] if checkpoint_id is not None
                      else list(self._in_flight.values()))
            if checkpoint_id is None:
                self._in_flight.clear()
        for snapshots in doomed:
            for snapshot in snapshots:
                snapshot.discard()

    def _complete_async(self, checkpoint_id: int, snapshots: list, sync_duration: float,
                        metrics: AlignmentMetrics, location: str, channel_snapshot=None) -> None:
        """The asynchronous part (Flink's AsyncCheckpointRunnable): write state, acknowledge."""
        started = time.monotonic()
        retries_before = storage_retry.COUNTER.of_this_thread()
        marker = self._phase("async", checkpoint_id)
        try:
            delay = self._hooks.get("async_delay")
            if delay:
                time.sleep(float(delay))
            states = {snapshot.uid: snapshot.run() for snapshot in snapshots}
            if channel_snapshot is not None:
                handle = channel_snapshot.run()   # waits for the input's last barrier to arrive
                if handle is not None:
                    head = states.get(self.head_uid) or OperatorSubtaskState()
                    states[self.head_uid] = dataclasses.replace(head, channel=(handle,))
        except SnapshotDiscardedError:
            log.debug("%s: checkpoint %d was aborted while its state was written", self.name, checkpoint_id)
            for snapshot in snapshots:   # what already finished must not stay behind
                snapshot.discard()
            self._phase_done(marker)
            return
        except Exception as exc:
            log.warning("%s: asynchronous part of checkpoint %d failed", self.name, checkpoint_id, exc_info=True)
            for snapshot in snapshots:
                snapshot.discard()
            try:
                self._decline(checkpoint_id, CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION, repr(exc))
            except TaskCancelled:
                log.debug("%s: could not decline checkpoint %d, the driver is gone", self.name, checkpoint_id)
            return
        finally:
            with self._in_flight_lock:
                self._in_flight.pop(checkpoint_id, None)
        ack = AcknowledgeCheckpoint(self.attempt_id, checkpoint_id, states, CheckpointMetrics(
            sync_duration=sync_duration, async_duration=time.monotonic() - started,
            alignment_duration=metrics.alignment_duration, start_delay=metrics.start_delay,
            bytes_processed_during_alignment=metrics.bytes_processed_during_alignment,
            bytes_persisted_of_in_flight_data=channel_snapshot.persisted_bytes if channel_snapshot else 0,
            unaligned=channel_snapshot is not None and channel_snapshot.unaligned,
            storage_retries=storage_retry.COUNTER.of_this_thread() - retries_before), location)
        try:
            self.driver.send({"type": "ack", **ack.to_wire()})
        except TaskCancelled:
            log.debug("%s: could not acknowledge checkpoint %d, the driver is gone", self.name, checkpoint_id)
        finally:
            self._phase_done(marker)

    # ================================================================== metrics, teardown
    def metrics(self) -> dict:
        return {
            "operators": {op.ctx.uid: {"name": op.ctx.name, "records_in": op.records_in,
                                       "records_out": op.output.records_out if op.output else 0,
                                       "input_watermark": self._input_watermark(op),
                                       "output_watermark": op.output.watermark if op.output else MIN_WATERMARK,
                                       "rocksdb": _rocksdb_metrics(op)}
                          for op in self.operators},
            "time": ({**self.time_account.reading(time.monotonic()), "attempt": self.deployment.attempt}
                     if self.time_account is not None else None),
            "peak_input_buffered_bytes": max((c.peak_buffered_bytes for c in self._inputs), default=0),
            "peak_output_queued_bytes": max((c.peak_queued_bytes for c in self._outputs), default=0),
            "bytes_received": sum(c.bytes_received for c in self._inputs),
            "bytes_sent": sum(c.bytes_sent for c in self._outputs),
            "max_frame_bytes": max((c.max_frame_bytes for c in self._outputs), default=0),
            # Buffer debloating: the smallest frame size (rows) a receiver asked of this task.
            "frame_rows": min((c.frame_rows for c in self._outputs if c.frame_rows is not None), default=None),
            "refused_connections": self._server.refused if self._server else 0,
            "local_recovery": self.local_store.metrics() if self.local_store is not None else None,
        }

    def _input_watermark(self, op) -> int:
        """The event time `op` was last told: the task input's for the head, else what the
        operator chained in front of it emitted. A source has none."""
        if op is self.head:
            return self._head_input_watermark
        upstream = self._upstream_of.get(op.ctx.uid)
        return upstream.output.watermark if upstream is not None and upstream.output else MIN_WATERMARK

    def close_operators(self) -> None:
        errors = []
        for op in self.operators:
            try:
                op.close()
            except Exception as exc:  # close every operator, report the first failure
                errors.append(exc)
        if errors:
            raise errors[0]

    def teardown(self) -> None:
        if self._async is not None:
            if self.cancelled:
                # Nobody will use these snapshots: discard them (their files go) and do not wait
                # long for them (recovery speed).
                self._discard_in_flight()
            self._async.shutdown(timeout=1.0 if self.cancelled else 60.0)
        if self._server is not None:
            self._server.stop()
        if self._log_relay is not None:     # before the connection closes: the last records go out
            log_relay.uninstall(self._log_relay)
            self._log_relay = None
        if self._control is not None:
            self._control.close()
        self.network.close()

    def pending_logs(self) -> dict | None:
        """The relayed log records not sent yet, as one batch (a failure report carries it)."""
        return None if self._log_relay is None else self._log_relay.take_pending()

    def flush_logs(self) -> None:
        """Send the relayed log records now (right after a failure report, before the task ends)."""
        if self._log_relay is not None:
            self._log_relay.flush()


def _describe_failure(exc: BaseException, task_name: str) -> tuple[str, bool]:
    if isinstance(exc, DataError):
        return str(exc.located(subtask=task_name)), True   # the subtask, if its raiser did not know it
    if isinstance(exc, UserFunctionError):
        return str(exc), True
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), False


# A task failing with one of these lost a neighbour (its input or its output connection): a
# follow-on of another subtask's failure, which the JobMaster counts, not a cause of its own.
FOLLOW_ON_ERRORS = (UpstreamLostError, ConnectionLost)


def _exception_line(exc: BaseException) -> str:
    """The failure in one line: the exception's class and message (the user's own exception
    for a UserFunctionError)."""
    if isinstance(exc, UserFunctionError):
        last = [line for line in exc.traceback_text.rstrip().splitlines() if line and not line.startswith(" ")]
        if last:
            return last[-1]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def run_task(deployment: Deployment, task_index: int, host: str | None = None) -> tuple:
    """Run one subtask to its end; failures are reported to the driver, not raised into Spark.

    Raising would make Spark print its own stack trace in front of ours; the driver already
    knows (from our report, or from the dropped connection) and cancels the job. The failure
    is not relayed as a log record as well: the report is how the driver learns it, and the
    JobMaster shows it once (the job's error, its exception history), with the follow-on
    failures of neighbouring subtasks folded into a count.
    """
    logging.basicConfig(level=getattr(logging, deployment.log_level, logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_allocator()
    task = StreamTask(deployment, task_index, host)
    status = "FINISHED"
    traced = None
    try:
        task.setup()
        freeze_after_setup()
        traced = trace.install(task)   # None unless STREAMSNAP_TRACE_DIR is set
        task.run()
        task.close_operators()
        task.driver.send({"type": "finished", "metrics": task.metrics()})
        if task.local_store is not None:
            # The job ended: its last checkpoint will not be restored here.
            task.local_store.release_job()
    except TaskCancelled as exc:
        status = "CANCELED"
        log.info("%s cancelled: %s", task.name, exc)
        _close_quietly(task)
    except BaseException as exc:
        status = "FAILED"
        text, user = _describe_failure(exc, task.name)
        follow_on = isinstance(exc, FOLLOW_ON_ERRORS)
        line = _exception_line(exc)
        # The report carries the log records still queued: sent before it they would delay it
        # at the driver, where a downstream task's report of the channel this one is about to
        # close could win; sent after it, the JobMaster's stop of the failed attempt (a SIGKILL
        # in a supervised slot) or the job's end could cut them off.
        told = False
        try:
            if task.driver is not None:
                upstream = getattr(exc, "upstream", None)
                task.driver.send({"type": "failed", "error": text, "user_error": user,
                                  "data_error": isinstance(exc, DataError), "follow_on": follow_on,
                                  "task": task.name, "exception": line,
                                  "lost": list(upstream) if upstream else None, "logs": task.pending_logs()})
                told = True
        except (TaskCancelled, OSError):
            pass
        # For this process's own log (the executor's, on a cluster), never relayed: the driver
        # has the report. A follow-on failure is one line, and so is one the driver hung up on
        # (it stopped the attempt for another failure, or it is gone: that is the cause then).
        unrelayed = {log_relay.NOT_RELAYED: True}
        if told and not follow_on:
            log.error("%s failed: %s", task.name, text, extra=unrelayed)
        else:
            log.info("%s failed %s: %s", task.name, "after losing a neighbour" if told else
                     "after the driver closed its connection", line, extra=unrelayed)
        task.flush_logs()
        _close_quietly(task)
    finally:
        task.teardown()
        if traced is not None:
            traced.close()
        unfreeze_at_teardown()
    return (task_index, str(task.vertex), status)


def _close_quietly(task: StreamTask) -> None:
    """Close operators after a failure; a second error must not hide the first."""
    try:
        task.close_operators()
    except Exception:
        log.debug("%s: error while closing operators after a failure", task.name, exc_info=True)
