"""Running a whole job from a test: `run_to_completion(env)` executes it on Spark and returns
its JobResult, or fails within a bounded time naming why (a test must never hang on a job that
cannot end, and must not leave it running into the next test)."""

from __future__ import annotations

from streamsnap.errors import ConfigurationError


def run_to_completion(env, job_name: str = "test job", *, timeout: float = 120.0,
                      restore_from: str | None = None):
    """Execute `env`'s job and wait for it to end; returns its JobResult (`result.rows()`).

    A job still running after `timeout` seconds is cancelled and a TimeoutError says so: a job
    under test must be bounded (a Generator with `count=`, `from_collection`, Kafka with
    `stop_at="latest"`). A failed job raises its JobExecutionError as `env.execute` does.
    """
    from streamsnap.api.environment import StreamEnvironment

    if not isinstance(env, StreamEnvironment):
        raise ConfigurationError(f"run_to_completion takes the ss.StreamEnvironment the job was "
                                 f"built on, got {type(env).__name__} {env!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigurationError(f"run_to_completion: timeout must be a positive number of "
                                 f"seconds, got {timeout!r}")
    client = env.execute_async(job_name, restore_from=restore_from)
    try:
        return client.wait(timeout)
    except TimeoutError:
        status = client.status()
        client.cancel()
        raise TimeoutError(
            f"job '{job_name}' was still {status} after {timeout} s and was cancelled; a job under "
            f"test must end by itself — give its sources an end (Generator(count=...), "
            f"from_collection, Kafka stop_at='latest') or raise timeout=") from None


__all__ = ["run_to_completion"]
