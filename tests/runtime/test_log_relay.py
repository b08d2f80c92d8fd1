"""The task log relay's sans-I/O batching and rate limit, the record encoding, and the re-emission
on the driver (runtime/log_relay.py)."""

from __future__ import annotations

import logging
import sys

import msgpack

from streamsnap.runtime import log_relay
from streamsnap.runtime.log_relay import BATCH_RECORDS, LogBatcher, TaskLogHandler, emit_on_driver, encode_record


def entry(i: int) -> dict:
    return {"level": logging.WARNING, "logger": "user", "message": f"m{i}", "created": 1.0, "path": "f.py",
            "line": i, "function": "fn", "thread": "t", "traceback": None}


def test_batches_leave_when_full_or_after_the_interval_in_order():
    batcher = LogBatcher(rate=1e9, burst=10_000, batch=3, interval=0.2, now=0.0)
    for i in range(2):
        batcher.add(entry(i), 0.0)
    assert not batcher.due(0.1)                      # neither full nor waited long enough
    assert batcher.due(0.25)
    batcher.add(entry(2), 0.0)
    batcher.add(entry(3), 0.0)
    assert batcher.due(0.0)                          # a full batch leaves at once
    first = batcher.take(0.0)
    assert [r["message"] for r in first["records"]] == ["m0", "m1", "m2"] and first["dropped"] == 0
    assert [r["message"] for r in batcher.take(0.3)["records"]] == ["m3"]
    assert batcher.take(0.4) is None and not batcher.due(10.0)


def test_a_chatty_task_is_rate_limited_and_the_drops_are_reported():
    batcher = LogBatcher(rate=10.0, burst=5, batch=100, interval=0.2, limit=1000, now=0.0)
    kept = sum(batcher.add(entry(i), 0.0) for i in range(50))
    assert kept == 5 and batcher.dropped == 45
    assert sum(batcher.add(entry(i), 1.0) for i in range(50)) == 5    # refilled 10 tokens, capped at the burst
    message = batcher.take(1.0)
    assert len(message["records"]) == 10 and message["dropped"] == 90
    assert batcher.dropped == 0 and batcher.dropped_total == 90
    # the queue bound holds when the sender falls behind
    bounded = LogBatcher(rate=1e9, burst=10_000, batch=10, limit=20, now=0.0)
    assert sum(bounded.add(entry(i), 0.0) for i in range(30)) == 20 and bounded.dropped == 10


def test_take_all_empties_the_queue_in_one_message_in_order_after_an_earlier_partial_take():
    batcher = LogBatcher(rate=1e9, burst=10_000, batch=3, interval=0.2, now=0.0)
    assert batcher.take_all(0.0) is None                     # nothing queued, nothing dropped
    for i in range(8):
        batcher.add(entry(i), 0.0)
    assert [r["message"] for r in batcher.take(0.0)["records"]] == ["m0", "m1", "m2"]
    rest = batcher.take_all(0.1)                             # more than a batch, in one message
    assert [r["message"] for r in rest["records"]] == ["m3", "m4", "m5", "m6", "m7"]
    assert rest["type"] == "logs" and rest["dropped"] == 0
    assert len(batcher) == 0 and batcher.take_all(0.2) is None and batcher.take(0.2) is None
    # drops alone make a message too, and are reported once
    limited = LogBatcher(rate=10.0, burst=1, batch=3, now=0.0)
    assert [limited.add(entry(i), 0.0) for i in range(3)] == [True, False, False]
    assert limited.take_all(0.0) == {"type": "logs", "records": [entry(0)], "dropped": 2}
    assert not limited.add(entry(3), 0.0) and limited.take_all(0.0) == {"type": "logs", "records": [], "dropped": 1}
    assert limited.take_all(0.0) is None


def test_a_record_is_encoded_as_plain_fields_with_its_traceback():
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("user.fn").makeRecord("user.fn", logging.ERROR, "job.py", 7, "bad row %s",
                                                         ({"k": 1},), __import__("sys").exc_info(), func="f")
    wire = encode_record(record, logging.Formatter())
    assert msgpack.unpackb(msgpack.packb(wire)) == wire           # msgpack-safe, no pickle
    assert wire["message"] == "bad row {'k': 1}" and wire["logger"] == "user.fn" and wire["line"] == 7
    assert "ValueError: boom" in wire["traceback"]
    unformattable = logging.LogRecord("x", logging.WARNING, "p", 1, "%d items", ("many",), None)
    assert "did not format" in encode_record(unformattable, logging.Formatter())["message"]
    long = logging.LogRecord("x", logging.WARNING, "p", 1, "y" * 20_000, None, None)
    assert len(encode_record(long, logging.Formatter())["message"]) < 8300


def test_the_handler_ships_batches_flushes_on_demand_and_the_driver_re_emits_them(caplog):
    sent = []
    handler = TaskLogHandler(sent.append, logging.WARNING,
                             {"operator": "Source: gen -> parse.v2", "subtask": 1, "parallelism": 2,
                              "host": "h", "pid": 42})
    logger = logging.getLogger("user.parse")
    logger.addHandler(handler)
    try:
        logger.info("not relayed: below the level")
        logger.warning("row %d looks odd", 5)
        try:
            {}["missing"]
        except KeyError:
            logger.exception("lookup failed")
        handler.flush()
    finally:
        logger.removeHandler(handler)
        handler.close()
    records = [r for m in sent for r in m["records"]]
    assert [r["message"] for r in records] == ["row 5 looks odd", "lookup failed"]
    assert all(m["operator"] == "Source: gen -> parse.v2" and m["subtask"] == 1 for m in sent)

    caplog.set_level(logging.WARNING)
    for message in sent:
        emit_on_driver(message, attempt=0)
    emitted = [r for r in caplog.records if r.name.startswith("streamsnap.task.")]
    assert [r.name for r in emitted] == ["streamsnap.task.Source: gen -> parse_v2.1"] * 2
    assert emitted[0].getMessage() == "[user.parse] row 5 looks odd"
    assert (emitted[0].task_operator, emitted[0].task_subtask, emitted[0].task_pid) == \
        ("Source: gen -> parse.v2", "2/2", 42)
    assert emitted[1].levelno == logging.ERROR and "KeyError: 'missing'" in emitted[1].exc_text
    assert "KeyError: 'missing'" in caplog.text


def test_a_failing_task_takes_what_is_still_queued_into_its_report_in_order():
    """run_task puts `take_pending()` in its failure report: all queued records, in one batch,
    after any batch the relay thread already sent, and nothing of them is sent twice."""
    sent = []
    handler = TaskLogHandler(sent.append, logging.WARNING, {"operator": "op", "subtask": 0, "parallelism": 1},
                             clock=lambda: 0.0)      # a stopped clock: nothing is due by time
    try:
        for i in range(BATCH_RECORDS + 5):      # one full batch (the thread may send it) and five
            handler.handle(logging.LogRecord("user", logging.WARNING, "p", 1, f"row {i}", None, None))
        pending = handler.take_pending()
        assert handler.take_pending() is None
        handler.flush()
    finally:
        handler.close()
    assert pending["type"] == "logs" and pending["operator"] == "op" and pending["dropped"] == 0
    shipped = [r["message"] for m in sent for r in m["records"]] + [r["message"] for r in pending["records"]]
    assert shipped == [f"row {i}" for i in range(BATCH_RECORDS + 5)]


def test_records_that_cannot_reach_the_driver_go_to_stderr(capsys):
    def gone(_message):
        raise ConnectionError("the connection to the driver is closed")

    handler = TaskLogHandler(gone, logging.WARNING, {"operator": "op", "subtask": 0, "parallelism": 1})
    handler.handle(logging.LogRecord("user", logging.WARNING, "p", 1, "kept anyway", None, None))
    handler.close()
    err = capsys.readouterr().err
    assert "could not reach the driver" in err and "WARNING user: kept anyway" in err


def test_install_and_uninstall_leave_the_root_logger_as_they_found_it():
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    sent = []
    handler = log_relay.install(sent.append, "INFO", "op", 0, 1, "h", 1)
    logging.getLogger("user").info("hello")
    log_relay.uninstall(handler)
    assert root.level == level and root.handlers == handlers
    assert [r["message"] for m in sent for r in m["records"]] == ["hello"]


def test_a_batch_the_driver_cannot_re_emit_is_reported_and_does_not_escape(caplog):
    class Refuse(logging.Filter):
        def filter(self, record):
            raise RuntimeError("a driver-side filter that raises")

    logger = logging.getLogger("streamsnap.task.op.0")
    refuse = Refuse()
    logger.addFilter(refuse)
    caplog.set_level(logging.WARNING)
    record = {"level": logging.WARNING, "logger": "user", "path": "p", "line": 1, "message": "m",
              "function": "f", "created": 0.0, "thread": "t"}
    try:
        emit_on_driver({"operator": "op", "subtask": 0, "parallelism": 1, "records": [record]}, attempt=0)
    finally:
        logger.removeFilter(refuse)
    reported = [r for r in caplog.records if r.name == "streamsnap.runtime.log_relay"]
    assert len(reported) == 1 and "could not be re-emitted" in reported[0].getMessage()
    assert "a driver-side filter that raises" in reported[0].exc_text


def _stderr_lines_with_relay(echo: bool, capsys) -> tuple[list[str], list[str]]:
    """(what the worker's own stderr handler printed, what the relay sent) for one relayed
    warning, one record the failure report carries, and one below the relay's level."""
    root = logging.getLogger()
    own = logging.StreamHandler(sys.stderr)
    own.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    level = root.level
    root.addHandler(own)
    root.setLevel(logging.DEBUG)
    sent = []
    try:
        handler = log_relay.install(sent.append, "WARNING", "op", 0, 1, "h", 1, echo=echo)
        logging.getLogger("user").warning("relayed")
        logging.getLogger("streamsnap.runtime.task").error("op failed: reported", extra={log_relay.NOT_RELAYED: True})
        logging.getLogger("user").info("below the relay's level")
        log_relay.uninstall(handler)
        logging.getLogger("user").warning("after the task")
    finally:
        root.removeHandler(own)
        root.setLevel(level)
    printed = [line for line in capsys.readouterr().err.splitlines() if line]
    return printed, [r["message"] for m in sent for r in m["records"]]


def test_a_worker_whose_stderr_is_the_drivers_prints_nothing_the_driver_shows(capsys):
    printed, relayed = _stderr_lines_with_relay(False, capsys)
    assert relayed == ["relayed"]                    # the reported failure is never relayed
    assert printed == ["INFO below the relay's level", "WARNING after the task"]
    printed, relayed = _stderr_lines_with_relay(True, capsys)   # a cluster's executor log keeps it all
    assert relayed == ["relayed"]
    assert printed == ["WARNING relayed", "ERROR op failed: reported", "INFO below the relay's level",
                       "WARNING after the task"]
