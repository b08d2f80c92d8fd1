"""Exceptions users see. Each says what happened and what to do about it."""

from __future__ import annotations


class StreamsnapError(Exception):
    """Base class of every error streamsnap raises on purpose."""


class ConfigurationError(StreamsnapError, ValueError):
    """A setting or a pipeline definition is invalid; raised when it is built."""


class JobExecutionError(StreamsnapError):
    """The job failed. `cause` is the root cause as text (user traceback, lost task, ...);
    `history` the job's exception history, oldest first (cluster/exception_history.py:
    one entry per failed attempt — exception, root cause, time, task, attempt, and the
    failures of other subtasks that followed from it)."""

    def __init__(self, message: str, *, job_name: str | None = None, cause: str | None = None,
                 reason: str | None = None, history: tuple = ()):
        super().__init__(message)
        self.job_name = job_name
        self.cause = cause
        self.reason = reason
        self.history = tuple(history)


def describe_row(row) -> str:
    """A row for an error message: its repr, cut at 500 characters."""
    shown = repr(row)
    return shown if len(shown) <= 500 else shown[:500] + "..."


class UserFunctionError(StreamsnapError):
    """A user function raised while processing a record.

    Carries the user's own traceback (not Spark's) first, then where it happened: the
    operator, the subtask and the offending record.
    """

    def __init__(self, operator: str, subtask: str, record, traceback_text: str):
        self.operator = operator
        self.subtask = subtask
        self.record = record
        self.traceback_text = traceback_text
        super().__init__(
            f"{traceback_text.rstrip()}\n"
            f"where: the user function of operator '{operator}', subtask {subtask}, on record {describe_row(record)}")


class RestoreError(StreamsnapError):
    """A checkpoint or savepoint cannot be restored (missing, corrupt, or incompatible)."""


class FileReadError(StreamsnapError):
    """A file of a FileSource could not be read (corrupt, wrong format, changed or vanished)."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path

    def __reduce__(self):
        return type(self), (str(self), self.path)


class AuthenticationError(StreamsnapError):
    """A peer did not prove it holds the job's secret."""


class DataError(StreamsnapError):
    """A row, a state value or a setting met at run time that the job cannot process: a schema
    mismatch, a null key, a missing event timestamp, a value the state serializer cannot keep.

    Deterministic: a restart replays the same input from the last checkpoint and meets the same
    row again, so the JobMaster fails the job at once instead of spending the restart budget
    (Flink's non-recoverable errors). The message names the operator, the subtask, the field,
    the row, its source position where the source knows it, and the fix; `located` adds what
    the place raising it did not know (the subtask, the row, the source position).
    """

    # The row's index in the batch being processed, where the raiser knew it: the source
    # operator turns it into a source position (split, offset). Never shown to users.
    batch_index: int | None = None
    source_position: str | None = None

    def __init__(self, message: str, *, operator: str | None = None, subtask: str | None = None,
                 field: str | None = None, row=None):
        super().__init__(message)
        self.operator = operator
        self.subtask = subtask
        self.field = field
        self.row = row

    def located(self, *, operator: str | None = None, subtask: str | None = None, row=None,
                source_position: str | None = None, user_frame: str | None = None) -> "DataError":
        """This error (changed in place, same class) with the context its raiser lacked added
        to the message: an operator and subtask in front, the row, source position and the
        line of the user's code that raised it as lines of their own."""
        message = str(self)
        if operator and self.operator is None:
            self.operator = operator
            if f"operator '{operator}'" not in message:
                where = f"operator '{operator}'" + (f" (subtask {subtask})" if subtask else "")
                message = f"{where}: {message}"
                if subtask:
                    self.subtask = subtask
        if subtask and self.subtask is None:
            self.subtask = subtask
            if subtask not in message:
                message += f"\n  subtask: {subtask}"
        if row is not None and self.row is None:
            self.row = row
            message += f"\n  row: {describe_row(row)}"
        if source_position and self.source_position is None:
            self.source_position = source_position
            message += f"\n  source position: {source_position}"
        if user_frame and "\n  raised by your code at " not in message:
            message += f"\n  raised by your code at {user_frame}"
        self.args = (message,)
        return self

    def __reduce__(self):
        return _rebuild_data_error, (type(self), str(self), self.operator, self.subtask, self.field, self.row)


def _rebuild_data_error(cls, message, operator, subtask, field, row):
    return cls(message, operator=operator, subtask=subtask, field=field, row=row)


class UsageError(DataError, TypeError):
    """A user function used the API in a way that cannot work — it returned something that is
    not a row, set a timer at a time that is not int milliseconds, asked its context for what it
    does not offer: user configuration found at run time.

    A DataError: a replay calls the function on the same input and meets it again, so the job
    fails at once. (A user function that *raises* is restarted, as in Flink: its cause may pass.)
    """


class SchemaError(DataError):
    """A row has a field its stream's schema lacks, lacks a required one, or a value of another type."""


class NullKeyError(DataError):
    """`key_by` met a row whose key is None (rejected unless `allow_null_keys=True`)."""


class PreflightError(ConfigurationError):
    """A check run by `execute()` before any Spark job failed: a path, a pickle, the executors."""


__all__ = ["StreamsnapError", "ConfigurationError", "PreflightError", "JobExecutionError", "UserFunctionError",
           "RestoreError", "FileReadError", "AuthenticationError", "DataError", "SchemaError", "NullKeyError"]


def __dir__() -> list[str]:
    """`dir()` lists the public names (`__all__`), not the module's imports and submodules."""
    return sorted(__all__)
