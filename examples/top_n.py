"""Top-N per window: the three most viewed products of every five minutes.

Two steps, as in Flink's classic "hot items" job:

1. *Count*: product views are keyed by product and counted in five-minute tumbling event-time
   windows with `aggregate_columns` (vectorized, no Python per row). Each product's count leaves
   the window operator when the watermark passes the window's end.
2. *Rank*: the counts are keyed by their window, and a `KeyedProcessFunction` gathers them in
   keyed list state and sets an event-time timer at the window's last millisecond. Watermarks
   travel in band behind the data and a task's watermark is the minimum over its inputs, so the
   timer fires only after every counting subtask has sent all of that window's counts; it then
   ranks them and emits the top three (ties broken by product name) and clears the state.

Run it:

    python examples/top_n.py
"""

from __future__ import annotations

from datetime import datetime, timezone

import streamsnap as ss

PRODUCTS = ["kettle", "toaster", "blender", "mixer", "grinder", "juicer", "scale", "timer"]
START = 1_795_000_200_000      # epoch milliseconds, on a five-minute boundary
WINDOW = 5 * 60                # seconds
TOP = 3


def view(i: int) -> dict:
    """View i, 300 ms after view i-1; products skewed towards the front of the list, with the
    favourite changing every few minutes."""
    h = (i * 2_654_435_761) & 0xFFFFFFFF
    shift = i // 900                                   # the mix changes every 4.5 minutes
    product = PRODUCTS[(min(h % 8, (h >> 8) % 8, (h >> 16) % 8) + shift) % len(PRODUCTS)]
    return {"product": product, "ts": START + i * 300}


class TopProducts(ss.KeyedProcessFunction):
    """Keyed by window end: collects the window's per-product counts, ranks them at the end."""

    def open(self, ctx):
        self.counts = ctx.get_state(ss.ListStateDescriptor("counts"))

    def process_element(self, row, ctx):
        if not self.counts.get():
            # The first count of this window: rank once the watermark has passed the window.
            ctx.timer_service().register_event_time_timer(row["window_end"] - 1)
        self.counts.add([row["product"], row["views"]])

    def on_timer(self, timestamp, ctx):
        ranked = sorted(self.counts.get(), key=lambda pc: (-pc[1], pc[0]))[:TOP]
        for rank, (product, views) in enumerate(ranked, start=1):
            yield {"window_end": ctx.current_key, "rank": rank, "product": product, "views": views}
        self.counts.clear()


def main(spark=None, views: int = 3_000) -> list[dict]:
    """Ranks `views` product views (300 ms apart: 3,000 are 15 minutes); returns the top rows."""
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    # Each split of the generator emits its views in time order.
    strategy = ss.WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("ts")
    events = env.from_source(ss.sources.Generator(view, count=views), name="views", watermark_strategy=strategy)
    counts = (events.key_by("product")
              .window(ss.windows.TumblingEventTimeWindows.of(WINDOW))
              .aggregate_columns({"views": "count"}, name="count per product", uid="counts"))
    (counts.key_by("window_end")
        .process(TopProducts(), name="top products", uid="top")
        .sink_to(ss.sinks.Collect(), name="top"))
    result = env.execute("top products")

    top = sorted(result.rows("top"), key=lambda r: (r["window_end"], r["rank"]))
    for r in top:
        end = datetime.fromtimestamp(r["window_end"] / 1000, timezone.utc).strftime("%H:%M")
        print(f"  window ending {end}  #{r['rank']} {r['product']:<8} {r['views']:>4} views")
    return top


if __name__ == "__main__":
    main()
