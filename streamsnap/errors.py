"""Exceptions users see. Each says what happened and what to do about it."""

from __future__ import annotations


class StreamsnapError(Exception):
    """Base class of every error streamsnap raises on purpose."""


class ConfigurationError(StreamsnapError, ValueError):
    """A setting or a pipeline definition is invalid; raised when it is built."""


class JobExecutionError(StreamsnapError):
    """The job failed. `cause` is the root cause as text (user traceback, lost task, ...)."""

    def __init__(self, message: str, *, job_name: str | None = None, cause: str | None = None,
                 reason: str | None = None):
        super().__init__(message)
        self.job_name = job_name
        self.cause = cause
        self.reason = reason


class UserFunctionError(StreamsnapError):
    """A user function raised while processing a record.

    Names the operator, the subtask and the offending record, and carries the user's own
    traceback (not Spark's) so the error can be read without digging.
    """

    def __init__(self, operator: str, subtask: str, record, traceback_text: str):
        self.operator = operator
        self.subtask = subtask
        self.record = record
        self.traceback_text = traceback_text
        shown = repr(record)
        if len(shown) > 500:
            shown = shown[:500] + "..."
        super().__init__(
            f"user function of operator '{operator}' (subtask {subtask}) failed on record {shown}\n"
            f"{traceback_text.rstrip()}")


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
    """A row does not fit its stream: a schema mismatch or a null key.

    Deterministic: a restart replays the same input from the last checkpoint and meets the same
    row again, so the JobMaster fails the job at once instead of spending the restart budget
    (Flink's non-recoverable errors). The message names the operator, the subtask, the field,
    the row and the fix.
    """

    def __init__(self, message: str, *, operator: str | None = None, subtask: str | None = None,
                 field: str | None = None, row=None):
        super().__init__(message)
        self.operator = operator
        self.subtask = subtask
        self.field = field
        self.row = row

    def __reduce__(self):
        return _rebuild_data_error, (type(self), str(self), self.operator, self.subtask, self.field, self.row)


def _rebuild_data_error(cls, message, operator, subtask, field, row):
    return cls(message, operator=operator, subtask=subtask, field=field, row=row)


class SchemaError(DataError):
    """A row has a field its stream's schema lacks, lacks a required one, or a value of another type."""


class NullKeyError(DataError):
    """`key_by` met a row whose key is None (rejected unless `allow_null_keys=True`)."""


class PreflightError(ConfigurationError):
    """A check run by `execute()` before any Spark job failed: a path, a pickle, the executors."""
