"""Keyed word count over a generated stream, with exactly-once checkpoints.

Sentences are generated deterministically from their index, split into words, keyed by word
and counted in keyed state (a ValueState per word). Each word's count is emitted once, final:
by an event-time timer at the end of time (MAX_WATERMARK), which fires when the input ends —
how a Flink job emits a bounded stream's result. Checkpoints are taken every 0.5 s; the exact
counts are printed, checked against a count done without streamsnap, with the job's summary.

    streamsnap run examples/word_count.py
"""

import tempfile
from collections import Counter

import streamsnap as ss
from streamsnap.time import MAX_WATERMARK

WORDS = ("stream", "snap", "spark", "flink", "state", "barrier", "checkpoint", "exactly", "once",
         "python", "arrow", "key", "group", "window", "sink", "source")
SENTENCES = 200_000


def sentence(i: int) -> dict:
    """Sentence i: five words picked by a cheap deterministic hash of the index."""
    h = (i * 2654435761) & 0xFFFFFFFF
    words = [WORDS[(h >> (4 * k)) % len(WORDS)] for k in range(5)]
    return {"id": i, "text": " ".join(words)}


def split(row: dict):
    for word in row["text"].split():
        yield {"word": word}


class Count(ss.KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.get_state(ss.ValueStateDescriptor("count", default=0))

    def process_element(self, row, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        if n == 1:  # the word's first row: emit its count when the input ends (the watermark's end)
            ctx.timer_service().register_event_time_timer(MAX_WATERMARK)

    def on_timer(self, timestamp, ctx):
        yield {"word": ctx.current_key, "count": self.count.value()}


def main() -> None:
    checkpoint_dir = tempfile.mkdtemp(prefix="streamsnap-wordcount-")
    env = ss.StreamEnvironment(
        parallelism=2,
        checkpointing=ss.CheckpointConfig(interval=0.5, directory=checkpoint_dir),
    )
    (env.from_source(ss.sources.Generator(sentence, count=SENTENCES), name="sentences")
        .flat_map(split, name="split")
        .key_by("word")
        .process(Count(), name="count", uid="count")
        .sink_to(ss.sinks.Collect(), name="counts"))
    print(env.explain())
    result = env.execute("word count")

    final = {row["word"]: row["count"] for row in result.rows("counts")}
    expected = Counter(w for i in range(SENTENCES) for w in sentence(i)["text"].split())
    assert final == expected, "counts disagree with a count done without streamsnap"
    print(f"\nword counts ({len(final)} words, {sum(final.values()):,} in all, each as counted without streamsnap):")
    for word, count in sorted(final.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {word:<12} {count:>8,}")
    print("\n" + result.summary())
    print(f"checkpoints written under {checkpoint_dir}")


if __name__ == "__main__":
    main()
