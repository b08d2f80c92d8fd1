"""User-facing configuration objects, validated where they are built.

A malformed value fails here, at construction, with a message naming the field and what is
allowed — never later inside a Spark task.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from streamsnap.errors import ConfigurationError
from streamsnap.network.liveness import MIN_PEER_TIMEOUT
from streamsnap.state.backends.changelog import ChangelogConfig
from streamsnap.state.backends.rocksdb.config import RocksDBConfig

CHECKPOINT_MODES = ("exactly_once", "at_least_once")
RETENTION_POLICIES = ("delete_on_cancellation", "retain_on_cancellation", "retain_on_finish")
RESUME_POLICIES = ("latest", "never")


def _positive_number(owner: str, name: str, value, *, allow_zero: bool = False, allow_none: bool = False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigurationError(f"{owner}.{name} must be a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(f"{owner}.{name} must be {bound}, got {value!r}")
    return float(value)


def _int_at_least(owner: str, name: str, value, minimum: int):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{owner}.{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _choice(owner: str, name: str, value, allowed: tuple[str, ...]):
    if value not in allowed:
        raise ConfigurationError(
            f"{owner}.{name} must be one of {', '.join(repr(a) for a in allowed)}, got {value!r}")
    return value


@dataclass(frozen=True)
class CheckpointConfig:
    """When and how checkpoints are taken (Flink's CheckpointConfig).

    interval: seconds between periodic checkpoints; None disables periodic checkpoints
      (savepoints can still be triggered).
    mode: "exactly_once" aligns barriers; "at_least_once" tracks them without blocking.
    directory: fsspec URL or local path under which `<job id>/chk-<n>/` is written.
    timeout: a checkpoint not complete after this many seconds is aborted (CHECKPOINT_EXPIRED).
    min_pause: minimum seconds from the end of one checkpoint to the start of the next.
    max_concurrent: how many checkpoints may be in flight at once.
    tolerable_failures: consecutive checkpoint failures tolerated before the job fails over.
    num_retained: completed checkpoints kept; older ones are deleted when subsumed.
    retention: what the job's checkpoints become when it ends (Flink's externalized checkpoint
      retention; a FAILED job always keeps them, to be resumed): "delete_on_cancellation"
      deletes them when the job is cancelled or finishes; "retain_on_cancellation" keeps them
      through `cancel()` (a new run resumes from them); "retain_on_finish" also keeps the final
      checkpoint of a FINISHED job — its state, readable with `ss.state.read` — which a new
      run does not resume from (the job had finished), but `restore_from=` can.
    unaligned / aligned_timeout: unaligned checkpoints (see ARCHITECTURE, step 6).
    resume: "latest" — when the directory already holds completed checkpoints of this job (the
      same job name, or `execute(..., job_id=...)`), e.g. because its driver died, the job
      resumes from the newest one, as Structured Streaming does with a checkpoint location;
      "never" — start fresh and leave them in place.
    storage_options: fsspec options for `directory` (and savepoint targets on the same store),
      as the filesystem's constructor takes them — for s3:// (s3fs): {"key": ..., "secret": ...,
      "endpoint_url": ..., "client_kwargs": {...}}. They reach the executors with the job; they
      are never logged nor shown by the REST API (only their names are).
    """

    interval: float | None = 10.0
    mode: str = "exactly_once"
    directory: str | None = None
    timeout: float = 600.0
    min_pause: float = 0.0
    max_concurrent: int = 1
    tolerable_failures: int = 0
    num_retained: int = 1
    retention: str = "delete_on_cancellation"
    unaligned: bool = False
    aligned_timeout: float | None = None
    resume: str = "latest"
    # Tasks stay up after their input ends until one last checkpoint has committed their
    # output (Flink's FLIP-147 final checkpoint); this bounds how long that may take.
    final_checkpoint: bool = True
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False, hash=False)

    def __post_init__(self):
        owner = "CheckpointConfig"
        if self.storage_options is not None:
            if not isinstance(self.storage_options, Mapping) or not all(
                    isinstance(k, str) for k in self.storage_options):
                raise ConfigurationError(
                    f"{owner}.storage_options must be a dict of fsspec options with string keys (e.g. "
                    f"{{'endpoint_url': 'http://127.0.0.1:9000', 'key': ..., 'secret': ...}}) or None, "
                    f"got a {type(self.storage_options).__name__}")
            object.__setattr__(self, "storage_options", dict(self.storage_options))
        _positive_number(owner, "interval", self.interval, allow_none=True)
        _choice(owner, "mode", self.mode, CHECKPOINT_MODES)
        if self.directory is not None and (not isinstance(self.directory, str) or not self.directory):
            raise ConfigurationError(
                f"{owner}.directory must be a non-empty path or fsspec URL, got {self.directory!r}")
        _positive_number(owner, "timeout", self.timeout)
        _positive_number(owner, "min_pause", self.min_pause, allow_zero=True)
        _int_at_least(owner, "max_concurrent", self.max_concurrent, 1)
        _int_at_least(owner, "tolerable_failures", self.tolerable_failures, 0)
        _int_at_least(owner, "num_retained", self.num_retained, 1)
        _choice(owner, "retention", self.retention, RETENTION_POLICIES)
        _choice(owner, "resume", self.resume, RESUME_POLICIES)
        if not isinstance(self.unaligned, bool):
            raise ConfigurationError(f"{owner}.unaligned must be True or False, got {self.unaligned!r}")
        _positive_number(owner, "aligned_timeout", self.aligned_timeout, allow_zero=True, allow_none=True)
        if self.aligned_timeout is not None and not self.unaligned:
            raise ConfigurationError(
                f"{owner}.aligned_timeout only applies to unaligned checkpoints; "
                f"set unaligned=True or leave aligned_timeout=None")
        if self.unaligned and self.mode != "exactly_once":
            raise ConfigurationError(f"{owner}.unaligned=True requires mode='exactly_once'")

    @property
    def exactly_once(self) -> bool:
        """Whether `mode` is "exactly_once" (barriers aligned, or unaligned with `unaligned=True`)."""
        return self.mode == "exactly_once"


@dataclass(frozen=True)
class RestartStrategy:
    """How the JobMaster reacts to a failure (Flink's restart strategies).

    Build one with `RestartStrategy.fixed_delay(...)`, `.exponential_delay(...)`,
    `.failure_rate(...)` or `.none()`. Whatever the strategy, a data or configuration error
    (errors.DataError) fails the job at once: a restart would replay the same input into it.
    """

    kind: str = "none"
    attempts: int = 0
    delay: float = 0.0
    initial: float = 1.0
    max_delay: float = 60.0
    multiplier: float = 2.0
    reset_after: float = 3600.0
    interval: float = 60.0

    def __post_init__(self):
        _choice("RestartStrategy", "kind", self.kind, ("none", "fixed_delay", "exponential_delay", "failure_rate"))

    @classmethod
    def none(cls) -> "RestartStrategy":
        """Never restart: the first failure fails the job."""
        return cls("none")

    @classmethod
    def fixed_delay(cls, attempts: int = 3, delay: float = 1.0) -> "RestartStrategy":
        """Restart up to `attempts` times (int >= 0), `delay` seconds apart (int/float >= 0).

            env = ss.StreamEnvironment(restart_strategy=ss.RestartStrategy.fixed_delay(attempts=5, delay=2))
        """
        _int_at_least("RestartStrategy.fixed_delay", "attempts", attempts, 0)
        _positive_number("RestartStrategy.fixed_delay", "delay", delay, allow_zero=True)
        return cls("fixed_delay", attempts=attempts, delay=float(delay))

    @classmethod
    def exponential_delay(cls, initial: float = 1.0, max: float = 60.0, multiplier: float = 2.0,
                          reset_after: float = 3600.0, attempts: int | None = None) -> "RestartStrategy":
        """Restart with delays growing from `initial` by `multiplier` up to `max` (seconds), the
        remaining arguments as the signature says (attempts < 0: unlimited restarts).
        """
        owner = "RestartStrategy.exponential_delay"
        _positive_number(owner, "initial", initial, allow_zero=True)
        _positive_number(owner, "max", max, allow_zero=True)
        if max < initial:
            raise ConfigurationError(f"{owner}.max ({max}) must be >= initial ({initial})")
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) or multiplier < 1:
            raise ConfigurationError(f"{owner}.multiplier must be a number >= 1, got {multiplier!r}")
        _positive_number(owner, "reset_after", reset_after)
        if attempts is not None:
            _int_at_least(owner, "attempts", attempts, 0)
        return cls("exponential_delay", attempts=-1 if attempts is None else attempts,
                   initial=float(initial), max_delay=float(max), multiplier=float(multiplier),
                   reset_after=float(reset_after))

    @classmethod
    def failure_rate(cls, max_failures: int = 1, interval: float = 60.0, delay: float = 1.0) -> "RestartStrategy":
        """Flink's failure-rate strategy: restart after `delay` seconds unless this failure is the
        (max_failures + 1)-th within `interval` seconds — a job failing now and then keeps
        running for good, one failing in a loop stops."""
        owner = "RestartStrategy.failure_rate"
        if isinstance(max_failures, bool) or not isinstance(max_failures, int) or max_failures < 1:
            raise ConfigurationError(
                f"{owner}.max_failures must be an integer >= 1 (the failures restarted per interval), got "
                f"{max_failures!r}; to never restart use RestartStrategy.none()")
        _positive_number(owner, "interval", interval)
        if math.isinf(interval):
            raise ConfigurationError(
                f"{owner}.interval must be a finite number of seconds, got {interval!r}; to bound the "
                f"restarts of the whole run use RestartStrategy.fixed_delay(attempts=...)")
        _positive_number(owner, "delay", delay, allow_zero=True)
        if delay >= interval:
            raise ConfigurationError(
                f"{owner}.delay ({delay:g} s) must be shorter than interval ({interval:g} s): otherwise "
                f"no two failures can fall within one interval; lengthen interval or shorten delay")
        return cls("failure_rate", attempts=max_failures, delay=float(delay), interval=float(interval))


@dataclass(frozen=True)
class NetworkConfig:
    """Data-plane tuning (Flink's buffer-timeout and network buffers).

    buffer_timeout: seconds a partly filled batch may wait before it is flushed (0 = flush
      after every emitted batch, lowest latency).
    batch_size: rows per network batch before it is flushed.
    merge_rows: rows up to which a receiving task merges the data frames already queued for
      it into one batch (None: 4 × batch_size). A vectorized operator that falls behind then
      pays its per-batch costs (a state read and write per distinct key and window) once for
      what piled up; one that keeps up sees frames as they arrive, so latency is unchanged.
      Nexmark q11 over Parquet input, RocksDB: +6-11 % against merging up to batch_size.
      Per-row operators take their input in chunks of 1024 rows regardless.
    credits: data frames a receiver lets each channel have in flight (credit-based flow
      control); together with `max_frame_bytes` this bounds memory per channel.
    output_queue_frames: frames a sender queues per channel before its task stops producing.
    debloat_target: None (off, the default, as in Flink) or seconds: buffer debloating — each
      receiving task measures the rows it consumes per busy second and has its senders cut
      frames so the data in flight to it (credits + queued frames per channel) is about this
      long to process (Flink's buffer-debloat target, 1 s there). Under backpressure an aligned
      barrier then waits behind about that much data instead of `credits + output_queue_frames`
      full batches per channel (`streamsnap.network.debloat`). Frames never exceed `batch_size`.
    peer_timeout: seconds (>= 2, default 5) after which a silent peer of a data or control
      connection — a lost host, a network partition: no FIN, no RST, nothing — is declared lost
      and the job fails over, as on a closed connection (kernel keepalive probes and
      TCP_USER_TIMEOUT, `streamsnap.network.liveness`; a busy user function is not silence);
      None: only closed connections are noticed.
    """

    buffer_timeout: float = 0.1
    batch_size: int = 4096
    merge_rows: int | None = None
    credits: int = 4
    output_queue_frames: int = 4
    bind_host: str | None = None
    debloat_target: float | None = None
    peer_timeout: float | None = 5.0

    def __post_init__(self):
        owner = "NetworkConfig"
        _positive_number(owner, "buffer_timeout", self.buffer_timeout, allow_zero=True)
        _int_at_least(owner, "batch_size", self.batch_size, 1)
        if self.merge_rows is not None:
            _int_at_least(owner, "merge_rows", self.merge_rows, 1)
        _int_at_least(owner, "credits", self.credits, 1)
        _int_at_least(owner, "output_queue_frames", self.output_queue_frames, 1)
        if _positive_number(owner, "debloat_target", self.debloat_target, allow_none=True) is not None \
                and math.isinf(self.debloat_target):
            raise ConfigurationError(f"{owner}.debloat_target must be a finite number of seconds (1.0 is "
                                     f"Flink's default) or None to turn debloating off, got {self.debloat_target!r}")
        if _positive_number(owner, "peer_timeout", self.peer_timeout, allow_none=True) is not None \
                and not MIN_PEER_TIMEOUT <= self.peer_timeout < math.inf:
            raise ConfigurationError(f"{owner}.peer_timeout must be a finite number of seconds >= {MIN_PEER_TIMEOUT:g} "
                                     f"(the kernel probes a silent peer in whole seconds; 5 is the default) or None "
                                     f"to notice closed connections only, got {self.peer_timeout!r}")
        if self.bind_host is not None and not isinstance(self.bind_host, str):
            raise ConfigurationError(f"NetworkConfig.bind_host must be a host name or None, got {self.bind_host!r}")

    @property
    def merge_limit(self) -> int:
        """`merge_rows`, or its default of 4 × batch_size."""
        return self.merge_rows if self.merge_rows is not None else 4 * self.batch_size


STATE_BACKENDS = ("hashmap", "rocksdb")


def validate_state_backend(value) -> "str | RocksDBConfig":
    """"hashmap", or the RocksDBConfig of the RocksDB backend ("rocksdb" = default sizes)."""
    if isinstance(value, RocksDBConfig):
        return value
    _choice("StreamEnvironment", "state_backend", value, STATE_BACKENDS)
    return RocksDBConfig() if value == "rocksdb" else value


__all__ = ["CheckpointConfig", "RestartStrategy", "NetworkConfig", "RocksDBConfig", "ChangelogConfig",
           "validate_state_backend", "CHECKPOINT_MODES", "RETENTION_POLICIES", "STATE_BACKENDS"]
