"""Task logs relayed to the driver's `logging` (the TaskManager log Flink's UI shows, in the
driver's own log).

Why: a subtask runs in a Spark Python worker (or a process it forked); what it logs goes to that
worker's stderr, i.e. the executor's log file on a cluster, which the person who started the job
rarely reads. A warning of a user function belongs in the log of the process that runs the job.

How: each task process adds a `TaskLogHandler` to its root logger at the job's level
(`StreamEnvironment(log_level=...)`, WARNING by default), so streamsnap's own loggers and the
user's `logging` calls are caught (the error that fails the task travels in its failure report). A record becomes a small dict of its fields (level, logger, formatted message, time,
source line, traceback text; never a pickle) and waits in a `LogBatcher`, the sans-I/O core:
batches of up to `BATCH_RECORDS` leave every `FLUSH_INTERVAL` seconds (sooner when a batch
fills) as one `{"type": "logs"}` message on the task's authenticated control connection; a
token bucket (`RATE` records/s, bursts of `BURST`) and a bounded queue keep a chatty task from
flooding that connection — what it drops is counted and reported as a warning. A failing task
carries the records still queued in its failure report (the JobMaster records the root cause,
then re-emits them: a downstream task's report of the channel this one closes cannot come
between, and the JobMaster's SIGKILL of the failed attempt cannot lose them); what it logs
after the report follows as usual (only a SIGKILL can lose the last `FLUSH_INTERVAL`). The failure itself is not relayed: records
marked `NOT_RELAYED` (the report carries them) stay in the worker's own log. When the driver is
unreachable the records go to the worker's stderr instead.

On a local master the worker's stderr is the driver's terminal: there (`echo=False`) the
worker's stderr handlers skip what the relay takes or the report carries, so nothing is
printed twice.

On the driver, `emit_on_driver` re-emits each record under the logger
`streamsnap.task.<operator chain>.<subtask index>` with the original time, level, source line
and traceback, and the attributes `task_operator`, `task_subtask` ("2/4"), `task_logger`,
`task_host`, `task_pid` and `task_attempt`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

FLUSH_INTERVAL = 0.2
BATCH_RECORDS = 100
RATE = 200.0            # records per second, sustained
BURST = 1000            # records at once
QUEUE_LIMIT = 2000      # records waiting at most; beyond it they are dropped and counted
MESSAGE_CHARS = 8192
TRACEBACK_CHARS = 32768
# `extra={NOT_RELAYED: True}`: a record for this process's own log only (the driver has it otherwise).
NOT_RELAYED = "streamsnap_not_relayed"


def encode_record(record: logging.LogRecord, formatter: logging.Formatter) -> dict:
    """The fields of `record` the driver re-emits, as msgpack-safe values."""
    try:
        message = record.getMessage()
    except Exception as exc:        # a bad format string must not lose the record
        message = f"{record.msg!r} (arguments {record.args!r} did not format: {exc})"
    text = None
    if record.exc_info:
        text = formatter.formatException(record.exc_info)
    elif record.exc_text:
        text = record.exc_text
    if record.stack_info:
        text = f"{text}\n{record.stack_info}" if text else record.stack_info
    return {"level": int(record.levelno), "logger": str(record.name),
            "message": _clip(str(message), MESSAGE_CHARS), "created": float(record.created),
            "path": str(record.pathname), "line": int(record.lineno or 0),
            "function": str(record.funcName or ""), "thread": str(record.threadName or ""),
            "traceback": None if text is None else _clip(text, TRACEBACK_CHARS)}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


class LogBatcher:
    """Sans-I/O: records in, batch messages out, rate-limited. Fed a clock by its caller."""

    def __init__(self, rate: float = RATE, burst: int = BURST, batch: int = BATCH_RECORDS,
                 interval: float = FLUSH_INTERVAL, limit: int = QUEUE_LIMIT, now: float = 0.0):
        self._rate, self._burst, self._batch, self._interval, self._limit = rate, burst, batch, interval, limit
        self._tokens = float(burst)
        self._refilled = now
        self._last_flush = now
        self._queue: deque[dict] = deque()
        self.dropped = 0            # dropped and not yet reported
        self.dropped_total = 0

    def add(self, entry: dict, now: float) -> bool:
        """Queue one encoded record; False if the rate limit or the queue bound dropped it."""
        self._tokens = min(float(self._burst), self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._tokens < 1.0 or len(self._queue) >= self._limit:
            self.dropped += 1
            self.dropped_total += 1
            return False
        self._tokens -= 1.0
        self._queue.append(entry)
        return True

    def full(self) -> bool:
        return len(self._queue) >= self._batch

    def due(self, now: float) -> bool:
        """Whether a batch should leave now: one is full, or records (or a drop count) waited
        `interval` since the last flush."""
        waiting = bool(self._queue) or self.dropped > 0
        return waiting and (self.full() or now - self._last_flush >= self._interval)

    def take(self, now: float) -> dict | None:
        """The next batch message (`records`, `dropped` since the last one), or None if empty."""
        return self._take(now, self._batch)

    def take_all(self, now: float) -> dict | None:
        """Every queued record in one message, in order, or None if empty: for a caller that
        sends them itself, where the batch size no longer matters (a failing task's report)."""
        return self._take(now, len(self._queue))

    def _take(self, now: float, count: int) -> dict | None:
        self._last_flush = now
        if not self._queue and not self.dropped:
            return None
        records = [self._queue.popleft() for _ in range(min(count, len(self._queue)))]
        message = {"type": "logs", "records": records, "dropped": self.dropped}
        self.dropped = 0
        return message

    def __len__(self) -> int:
        return len(self._queue)


class TaskLogHandler(logging.Handler):
    """Catches a task process's log records and ships them in batches with `send`.

    `emit` only encodes and queues (no I/O, so it never blocks the mailbox thread nor recurses
    through the connection's own logging); a daemon thread sends what is due, and `flush()`
    sends everything now (the error paths and teardown call it)."""

    def __init__(self, send: Callable[[dict], None], level: int, task: dict,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(level)
        self._send = send
        self._task = task
        self._clock = clock
        self._batcher = LogBatcher(now=clock())
        self._guard = threading.Lock()          # the batcher
        self._sending = threading.Lock()        # one sender at a time, batches in order
        self._wake = threading.Event()
        self._closed = False
        self._formatter = logging.Formatter()
        self._thread = threading.Thread(target=self._loop, name="streamsnap-log-relay", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("streamsnap.task.") or getattr(record, NOT_RELAYED, False):
            return      # a relayed record (not ours to relay again), or one the driver has otherwise
        entry = encode_record(record, self._formatter)
        with self._guard:
            self._batcher.add(entry, self._clock())
            full = self._batcher.full()
        if full:
            self._wake.set()

    def _loop(self) -> None:
        while not self._closed:
            self._wake.wait(FLUSH_INTERVAL)
            self._wake.clear()
            self._deliver(everything=False)

    def flush(self) -> None:
        self._deliver(everything=True)

    def _deliver(self, everything: bool) -> None:
        with self._sending:
            while True:
                with self._guard:
                    now = self._clock()
                    if not (self._batcher.due(now) or (everything and (len(self._batcher) or self._batcher.dropped))):
                        return
                    message = self._batcher.take(now)
                if message is None:
                    return
                message.update(self._task)
                try:
                    self._send(message)
                except Exception as exc:
                    _to_stderr(message, exc)

    def take_pending(self) -> dict | None:
        """Everything still queued, as one batch message the caller sends itself (a failing
        task's report carries it: a SIGKILL of the failed attempt cannot lose it then), or None."""
        with self._sending:     # a batch the thread is sending goes out first: order is kept
            with self._guard:
                message = self._batcher.take_all(self._clock())
        return None if message is None else {**message, **self._task}

    def close(self) -> None:
        """Send what is left and stop the thread."""
        self.flush()
        self._closed = True
        self._wake.set()
        self._thread.join(2)
        super().close()


def _to_stderr(message: dict, exc: BaseException) -> None:
    """The driver is unreachable: the records go to this worker's stderr (the executor log)."""
    where = f"{message.get('operator')} ({message.get('subtask', 0) + 1}/{message.get('parallelism')})"
    sys.stderr.write(f"streamsnap: {len(message['records'])} log records of {where} could not reach "
                     f"the driver ({type(exc).__name__}: {exc}):\n")
    for entry in message["records"]:
        sys.stderr.write(f"{logging.getLevelName(entry['level'])} {entry['logger']}: {entry['message']}\n")
        if entry["traceback"]:
            sys.stderr.write(entry["traceback"] + "\n")


class _ShownByTheDriver(logging.Filter):
    """On a stderr handler of a worker whose stderr is the driver's terminal: drop the records
    the driver shows (those the relay takes, those a report carries)."""

    def __init__(self, relay: TaskLogHandler):
        super().__init__()
        self._relay = relay

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, NOT_RELAYED, False):
            return False
        return record.levelno < self._relay.level or record.name.startswith("streamsnap.task.")


def _stderr_handlers(root: logging.Logger) -> list[logging.Handler]:
    return [h for h in root.handlers if isinstance(h, logging.StreamHandler)
            and getattr(h, "stream", None) in (sys.stderr, sys.__stderr__)]


def install(send: Callable[[dict], None], level: str, operator: str, subtask: int, parallelism: int,
            host: str, pid: int, echo: bool = True) -> TaskLogHandler:
    """Relay this process's records at `level` and above through `send`; `uninstall` undoes it.
    `echo=False`: this process's stderr is the driver's (a local master), so its stderr handlers
    skip what the driver shows."""
    numeric = logging.getLevelName(level)
    handler = TaskLogHandler(send, numeric, {"operator": operator, "subtask": subtask,
                                             "parallelism": parallelism, "host": host, "pid": pid})
    root = logging.getLogger()
    handler.previous_root_level = root.level
    if root.level > numeric or root.level == logging.NOTSET:
        root.setLevel(numeric)
    handler.quieted = []
    if not echo:
        quiet = _ShownByTheDriver(handler)
        for stream_handler in _stderr_handlers(root):
            stream_handler.addFilter(quiet)
            handler.quieted.append((stream_handler, quiet))
    root.addHandler(handler)
    logging.captureWarnings(True)      # warnings.warn from user code too
    return handler


def uninstall(handler: TaskLogHandler) -> None:
    """Flush and remove the handler (Spark reuses Python workers for later tasks)."""
    root = logging.getLogger()
    root.removeHandler(handler)
    for stream_handler, quiet in handler.quieted:
        stream_handler.removeFilter(quiet)
    handler.close()
    root.setLevel(handler.previous_root_level)
    logging.captureWarnings(False)


def logger_name(operator: str, subtask: int) -> str:
    """`streamsnap.task.<operator>.<subtask index>`; dots in the name would nest loggers."""
    return f"streamsnap.task.{operator.replace('.', '_')}.{subtask}"


def emit_on_driver(message: dict, attempt: int | None = None) -> None:
    """Re-emit one batch of task records in the driver's `logging`.

    It runs on the task's control connection thread: a batch that cannot be re-emitted (a
    malformed entry, a driver-side logging filter or handler that raises) is reported here
    with its traceback and the task goes on — an escaping error would close the connection,
    and the JobMaster would take the task for lost."""
    try:
        _emit(message, attempt)
    except Exception:
        logging.getLogger(__name__).exception(
            "a batch of log records from %s (subtask %s) could not be re-emitted on the driver; the "
            "task goes on. Check the driver's logging filters and handlers for streamsnap.task.*",
            message.get("operator", "?"), message.get("subtask", "?"))


def _emit(message: dict, attempt: int | None) -> None:
    operator = str(message.get("operator", "?"))
    subtask, parallelism = int(message.get("subtask", 0)), int(message.get("parallelism", 0))
    logger = logging.getLogger(logger_name(operator, subtask))
    extra = {"task_operator": operator, "task_subtask": f"{subtask + 1}/{parallelism}",
             "task_host": message.get("host"), "task_pid": message.get("pid"), "task_attempt": attempt}
    for entry in message.get("records", ()):
        level = int(entry["level"])
        if not logger.isEnabledFor(level):
            continue
        origin = str(entry["logger"])
        record = logger.makeRecord(logger.name, level, str(entry["path"]), int(entry["line"]),
                                   f"[{origin}] {entry['message']}", None, None,
                                   func=str(entry["function"]), extra={**extra, "task_logger": origin})
        record.created = float(entry["created"])
        record.msecs = (record.created - int(record.created)) * 1000
        record.threadName = str(entry["thread"])
        if entry.get("traceback"):
            record.exc_text = str(entry["traceback"])
        logger.handle(record)
    dropped = int(message.get("dropped", 0))
    if dropped:
        logger.warning("%d log records of %s (subtask %d/%d) were dropped by the task's rate limit "
                       "(%d records/s, bursts of %d)", dropped, operator, subtask + 1, parallelism,
                       RATE, BURST, extra={**extra, "task_logger": __name__})
