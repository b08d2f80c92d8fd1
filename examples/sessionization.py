"""Clickstream sessionization with late data sent to a side output.

A web shop's click events arrive slightly out of order. Each user's clicks are grouped into
event-time *session windows*: a session ends after 10 minutes without a click. For every session
the job emits the user, its first and last click, the number of clicks and the pages visited,
computed incrementally by an `AggregateFunction` (whose `merge` joins two sessions when a click
bridges their gap) and labelled by a `ProcessWindowFunction`.

A click that arrives after the watermark has already closed its session (a phone that was
offline and uploaded its clicks much later) is *late*: instead of being silently dropped it goes
to a side output (`side_output_late_data`), where the job collects it for a separate report.

The watermark trails the largest timestamp seen by one minute and is emitted after every click
(a punctuated watermark on a single ordered input), so which click is late depends only on the
data — the output below is the same on every run.

Run it:

    python examples/sessionization.py
"""

from __future__ import annotations

from datetime import datetime, timezone

import streamsnap as ss

SESSION_GAP = 10 * 60          # seconds without a click that end a session
OUT_OF_ORDERNESS_MS = 60_000   # how far behind the newest click the watermark trails

DAY = datetime(2026, 11, 28, tzinfo=timezone.utc)

# (user, time of day, page) in arrival order. Clicks up to a minute out of order are on time;
# the two marked "late" arrive after their session has closed.
CLICKS = [
    ("ann", "09:00:05", "/home"),
    ("bob", "09:01:00", "/home"),
    ("ann", "09:02:30", "/shoes"),
    ("ann", "09:02:10", "/search"),       # 20 s out of order: still on time
    ("bob", "09:03:15", "/hats"),
    ("ann", "09:07:00", "/cart"),
    ("bob", "09:09:40", "/checkout"),
    ("cid", "09:15:00", "/home"),
    ("ann", "09:25:00", "/home"),         # 18 min after /cart: a new session for ann
    ("cid", "09:21:30", "/sale"),
    ("ann", "09:26:45", "/socks"),
    ("bob", "09:05:00", "/hats"),         # late: bob's session ended at 09:19:40, watermark is past it
    ("cid", "09:33:00", "/sale"),         # 11.5 min after /sale: a new session for cid
    ("ann", "09:40:00", "/home"),
    ("cid", "09:12:00", "/home"),         # late as well
    ("ann", "09:41:10", "/checkout"),
]


def to_ms(clock: str) -> int:
    """'HH:MM:SS' on DAY as epoch milliseconds (event timestamps are epoch ms)."""
    h, m, s = (int(part) for part in clock.split(":"))
    return int(DAY.replace(hour=h, minute=m, second=s).timestamp() * 1000)


def clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%H:%M:%S")


def click(i: int) -> dict:
    user, at, page = CLICKS[i]
    return {"user": user, "page": page, "ts": to_ms(at)}


class EveryClick(ss.WatermarkGenerator):
    """Bounded out-of-orderness, emitted after every batch of clicks rather than periodically."""

    def __init__(self):
        self.newest = None

    def on_event(self, timestamp, output):
        self.newest = timestamp if self.newest is None else max(self.newest, timestamp)

    def on_batch(self, timestamps, output):
        super().on_batch(timestamps, output)               # calls on_event per click
        output.emit_watermark(self.newest - OUT_OF_ORDERNESS_MS - 1)

    def on_periodic_emit(self, output):
        """Nothing: every batch already emitted its watermark."""


class SessionStats(ss.AggregateFunction):
    """Accumulator: [clicks, first ts, last ts, pages in time order as (ts, page) pairs]."""

    def create_accumulator(self):
        return [0, None, None, []]

    def add(self, row, acc):
        clicks, first, last, pages = acc
        ts = row["ts"]
        return [clicks + 1, ts if first is None else min(first, ts), ts if last is None else max(last, ts),
                sorted(pages + [[ts, row["page"]]])]

    def merge(self, a, b):
        # Two sessions of one user joined by a click in between.
        return [a[0] + b[0], min(a[1], b[1]), max(a[2], b[2]), sorted(a[3] + b[3])]

    def get_result(self, acc):
        clicks, first, last, pages = acc
        return {"clicks": clicks, "first": first, "last": last, "pages": [p for _, p in pages]}


class LabelSession(ss.ProcessWindowFunction):
    def process(self, user, context, elements):
        (stats,) = elements            # with aggregate(...): the one pre-aggregated result
        yield {"user": user, "start": clock(stats["first"]), "end": clock(stats["last"]),
               "clicks": stats["clicks"], "pages": " > ".join(stats["pages"]),
               "closes_at": clock(context.window.end)}


def main(spark=None) -> dict:
    """Runs the job (on `spark`, or an embedded local session); returns the sessions and late clicks."""
    env = ss.StreamEnvironment(parallelism=2, spark=spark)
    strategy = ss.WatermarkStrategy.for_generator(EveryClick).with_timestamp_assigner("ts")
    # One split, one click per batch: the clicks keep their arrival order, each followed by its watermark.
    source = ss.sources.Generator(click, count=len(CLICKS), splits=1, batch_size=1)
    events = env.from_source(source, name="clicks", watermark_strategy=strategy, parallelism=1)

    late = ss.OutputTag("late-clicks")
    sessions = (events.key_by("user")
                .window(ss.windows.EventTimeSessionWindows.with_gap(SESSION_GAP))
                .side_output_late_data(late)
                .aggregate(SessionStats(), LabelSession(), name="sessions", uid="sessions"))
    sessions.sink_to(ss.sinks.Collect(), name="sessions")
    sessions.get_side_output(late).sink_to(ss.sinks.Collect(), name="late")

    result = env.execute("clickstream sessions")
    out = {
        "sessions": sorted(result.rows("sessions"), key=lambda s: (s["user"], s["start"])),
        "late": sorted(({"user": r["user"], "at": clock(r["ts"]), "page": r["page"]} for r in result.rows("late")),
                       key=lambda r: (r["user"], r["at"])),
    }
    print("sessions:")
    for s in out["sessions"]:
        print(f"  {s['user']:<4} {s['start']}-{s['end']}  {s['clicks']} clicks  {s['pages']}")
    print("late clicks (side output):")
    for r in out["late"]:
        print(f"  {r['user']:<4} {r['at']}  {r['page']}")
    return out


if __name__ == "__main__":
    main()
