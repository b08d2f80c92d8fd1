"""Recovery of a large keyed state on RocksDB in changelog mode, with and without task-local
recovery, in one process: `python -m benchmarks.changelog_recovery [--keys N] [--pairs P]`.

Why a script of its own: the machine is shared, so the two sides are only comparable when they
run alternately (remote, local, remote, local, ...) in one session, with the load average
printed beside them. Each run is `state_backends.large_state` with the suite's changelog
configuration (materialization every 30 s; the window starts after the first materialization
taken after the load): a `sum` subtask is SIGKILLed in the steady phase and the whole state is
restored — the materialization plus the log after it. Printed per run: seconds from the kill to
the first row at the sink and to RUNNING, and what the restore read locally and from checkpoint
storage (here the same local disk, so the local side saves the copies, not a network transfer).
"""

from __future__ import annotations

import argparse
import os
import statistics

from benchmarks import state_backends


def _config():
    from streamsnap import ChangelogConfig, RocksDBConfig

    return RocksDBConfig(changelog=ChangelogConfig(materialization_interval=30.0))


def run(spark, keys: int, local: bool) -> dict:
    label = "rocksdb+changelog" + ("+local" if local else "")
    return state_backends.large_state(spark, keys, _config(), steady_checkpoints=3, label=label, settle=True,
                                      local_recovery=local)


def _line(r: dict) -> str:
    restore = r.get("restore") or {}
    read = (f"read {restore.get('local_files', 0)} files / {restore.get('local_bytes', 0) / 1e6:.1f} MB locally, "
            f"{restore.get('remote_files', 0)} files / {restore.get('remote_bytes', 0) / 1e6:.1f} MB from storage"
            if restore else "read: not reported")
    return (f"{r['backend']:24} first output {r['recovery_first_output']:.2f} s, running "
            f"{r['recovery_running']:.2f} s; {read}; load average {os.getloadavg()[0]:.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.changelog_recovery", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=10_000_000)
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args(argv)
    from streamsnap.cluster.spark_session import embedded_session

    spark = embedded_session(16)
    results: dict[bool, list[dict]] = {False: [], True: []}
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for _ in range(args.pairs):
        for local in (False, True):
            r = run(spark, args.keys, local)
            results[local].append(r)
            print(_line(r), flush=True)
    for local in (False, True):
        first = [r["recovery_first_output"] for r in results[local]]
        print(f"{'with' if local else 'without'} local recovery: first output median {statistics.median(first):.2f} s "
              f"({', '.join(f'{x:.2f}' for x in first)})", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
