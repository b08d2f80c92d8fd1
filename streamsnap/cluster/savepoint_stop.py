"""Savepoints asked of a running job, and stop-with-savepoint (Flink's `stop`, with `--drain`).

A savepoint is a checkpoint the user triggers into a directory of their choice. With
`terminate` the job then finishes, and the request resolves once it is FINISHED; with `drain`
the sources first end event time, so every window fires into the savepoint — after which the
job must not run on from it, and a drain that failed half-way fails the job over (as Flink
does). The JobMaster (cluster/jobmaster.py) resolves a pending stop when the job ends.
"""

from __future__ import annotations

import concurrent.futures

from streamsnap.checkpoint import filesystem
from streamsnap.cluster.status import JobStatus
from streamsnap.errors import StreamsnapError


class SavepointStop:
    """Mixin of the JobMaster, on its event loop: `_trigger_savepoint` (trigger_savepoint's work),
    and the errors of a stop that a failure interrupted. Sets the master's `_stopping`."""

    def _trigger_savepoint(self, directory, terminate: bool, drain: bool, result: concurrent.futures.Future) -> None:
        if self.coordinator is None:
            result.set_exception(StreamsnapError(
                "savepoints need a checkpoint configuration: pass checkpointing=CheckpointConfig(interval=None, "
                "directory=...) to StreamEnvironment (interval=None means no periodic checkpoints)"))
            return
        if self.status is not JobStatus.RUNNING:
            result.set_exception(StreamsnapError(f"cannot take a savepoint while the job is {self.status.value}"))
            return
        attempt = self._attempt
        drain = terminate and drain
        future = self.coordinator.trigger_savepoint(directory, terminate=terminate, drain=drain)

        def done(f):
            def on_loop():
                if f.exception() is not None:
                    if drain:
                        self._drain_failed(f.exception(), attempt, result)
                    else:
                        result.set_exception(f.exception())
                    return
                path = filesystem.user_path(f.result().external_pointer)
                if not terminate:
                    result.set_result(path)
                elif not self._attempts.is_live(attempt) or self.status.is_terminal:
                    # The attempt failed after the savepoint completed: the restart restores it.
                    if drain:
                        self._stopping = (path, result, True)
                    else:
                        result.set_exception(self._stop_interrupted(path))
                else:  # resolved when the job has FINISHED (Flink's stop-with-savepoint)
                    self._stopping = (path, result, drain)
                    self.coordinator.stop_periodic_scheduler()
                    self._send_all({"type": "finish", "drain": drain})
            self._post(on_loop)
        future.add_done_callback(done)

    def _drain_failed(self, error: BaseException, attempt: int, result: concurrent.futures.Future) -> None:
        """A stop-with-savepoint with drain failed. If its trigger reached the sources, they
        ended event time: every open window fired early and every later row would be late. As
        Flink does, the job fails over to its latest checkpoint, so it runs on as if no stop
        had been asked (a failure before the trigger changed nothing)."""
        reason = getattr(error, "reason", None)
        if getattr(reason, "pre_flight", False) or not self._attempts.is_live(attempt) or self.status.is_terminal:
            result.set_exception(error)
            return
        latest = self.coordinator.completed_store.latest()
        back_to = f"checkpoint {latest.checkpoint_id}" if latest is not None else "the start of its input"
        result.set_exception(StreamsnapError(
            f"stop-with-savepoint with drain failed: {error}. The sources had already ended event time, so "
            f"the job fails over to {back_to} and runs on as if no stop had been asked; call "
            f"stop_with_savepoint again to stop it"))
        self._handle_failure(f"stop-with-savepoint with drain failed ({error}); event time had ended, so the "
                             f"job restores {back_to}", "STOP_WITH_SAVEPOINT_FAILED", attempt)

    def _stop_interrupted(self, path: str) -> StreamsnapError:
        return StreamsnapError(
            f"the stop-with-savepoint's savepoint completed at {path}, but the job failed before it finished "
            f"({(self._failure or 'no cause recorded').splitlines()[0]}); the job restores from that savepoint "
            f"and runs on, so nothing is committed twice — call stop_with_savepoint again to stop it")


__all__ = ["SavepointStop"]
