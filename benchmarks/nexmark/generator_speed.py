"""How fast the Nexmark generator makes events: `python -m benchmarks.nexmark.generator_speed`.

Prints events per CPU second (events/s per core; other load on the machine does not count) of
each stream, vectorized (RecordBatches of the given sizes, asked for as a Generator split asks:
consecutive runs) and per row, best of a few rounds. The generator is part of every Nexmark
query's cost, so it must be well above the query rates it is compared with.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from streamsnap.connectors import nexmark


def rate(fn, batch: int | None, seconds: float, rounds: int = 3) -> float:
    best = 0.0
    for r in range(rounds):
        start, done, began, cpu = 10**9 * (r + 1), 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - began < seconds / rounds:
            if batch is None:
                fn(start + done)
                done += 1
            else:
                fn(start + done + np.arange(batch, dtype=np.int64))
                done += batch
        best = max(best, done / (time.process_time() - cpu))
    return best


def flat_stream(config: nexmark.NexmarkConfig, batch: int = 8192, seconds: float = 3.0) -> dict:
    """The flat event stream as the Nexmark benchmark's source makes it (vectorized, `batch`
    events a call): events per CPU second, i.e. what one core spends generating each event of a
    query's input — so a query's events/s per core over this is the generator's share of it."""
    if batch < 1 or seconds <= 0:
        raise ValueError(f"batch must be >= 1 and seconds > 0, got batch={batch}, seconds={seconds}")
    generate = nexmark.events(config, vectorized=True)
    generate(np.arange(1, dtype=np.int64))     # build the vocabularies outside the measurement
    return {"events_per_cpu_second": rate(generate, batch, seconds), "batch": batch, "seconds": seconds}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--batch", type=int, nargs="*", default=[1024, 8192, 65536])
    parser.add_argument("--no-extra", action="store_true", help="pad_extra=False")
    args = parser.parse_args(argv)
    config = nexmark.NexmarkConfig(pad_extra=not args.no_extra)
    nexmark.events(config)(0)           # build the vocabularies outside the measurement
    for kind in nexmark.KINDS:
        fn = getattr(nexmark, kind)
        cells = [f"batch {b}: {rate(fn(config, vectorized=True), b, args.seconds) / 1e6:5.2f} M/s" for b in args.batch]
        cells.append(f"per row: {rate(fn(config), None, args.seconds) / 1e3:5.1f} K/s")
        print(f"{kind:9s} " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
