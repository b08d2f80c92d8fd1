"""The Nexmark generator (replayable: event i is a pure function of i, per row and vectorized
alike) and the plain-Python reference queries (checked on hand-made events with known answers)."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

import streamsnap as ss
from benchmarks.nexmark import reference as ref
from benchmarks.nexmark.reference import event
from streamsnap.connectors import nexmark as nx
from streamsnap.connectors.nexmark import AUCTION, BID, PERSON, NexmarkConfig
from streamsnap.errors import ConfigurationError
from streamsnap.runtime.operators.base import OperatorContext

CONFIGS = [
    NexmarkConfig(),
    NexmarkConfig(seed=5, out_of_order_group_size=37, events_per_second=333, pad_extra=False),
    NexmarkConfig(seed=-3, person_proportion=2, auction_proportion=5, bid_proportion=13, num_active_people=7,
                  num_in_flight_auctions=3, hot_auction_ratio=1, hot_bidders_ratio=9, out_of_order_group_size=5,
                  events_per_second=100),
]


def rows(kind, config, indices):
    return [getattr(nx, kind)(config)(i) for i in indices]


def vectorized(kind, config, indices):
    batch = getattr(nx, kind)(config, vectorized=True)(np.asarray(indices, dtype=np.int64))
    batch.validate(full=True)
    assert batch.schema.equals(nx.SCHEMAS[kind])
    return batch.to_pylist()


def events(config, n):
    return vectorized("events", config, range(n))


# ===================================================================== determinism
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("kind", nx.KINDS)
def test_per_row_and_vectorized_give_identical_events(config, kind):
    indices = list(range(0, 2000)) + list(range(10**9, 10**9 + 300))
    assert vectorized(kind, config, indices) == rows(kind, config, indices)


@settings(max_examples=examples(25), deadline=None)
@given(start=st.integers(0, 10**14), length=st.integers(1, 200), stride=st.integers(1, 9),
       seed=st.integers(-2**70, 2**70), group=st.integers(1, 60).filter(lambda g: g == 1 or 953 % g > 1),
       kind=st.sampled_from(nx.KINDS))
def test_any_slice_of_indices_is_the_same_events(start, length, stride, seed, group, kind):
    config = NexmarkConfig(seed=seed, out_of_order_group_size=group)
    indices = [start + stride * k for k in range(length)]
    assert vectorized(kind, config, indices) == rows(kind, config, indices)


def test_event_i_does_not_depend_on_calls_before_it_or_on_the_batching():
    config = CONFIGS[1]
    whole = events(config, 5000)
    f = nx.events(config, vectorized=True)      # one instance: its read-ahead sees every request
    pieces, start = [], 0
    for size in [1, 7, 1000, 3, 8192, 600] * 3:
        end = min(start + size, 5000)
        pieces += f(np.arange(start, end)).to_pylist()
        start = end
    assert pieces == whole
    # two splits of a Generator, interleaved, as a reader round-robins over its splits
    split0, split1 = [], []
    for pos in range(0, 2500, 100):
        split0 += f(2 * np.arange(pos, pos + 100)).to_pylist()
        split1 += f(1 + 2 * np.arange(pos, pos + 100)).to_pylist()
    assert split0 == whole[0::2] and split1 == whole[1::2]
    # reversed and scattered indices, a fresh instance, a pickled one
    scattered = [4999, 3, 4000, 17, 17, 2500]
    assert f(np.array(scattered)).to_pylist() == [whole[i] for i in scattered]
    assert pickle.loads(pickle.dumps(f))(np.arange(100, 200)).to_pylist() == whole[100:200]
    assert events(CONFIGS[1], 5000) == whole
    assert events(NexmarkConfig(seed=6), 100) != events(NexmarkConfig(seed=5), 100)


def test_one_kind_streams_hold_the_same_events_as_the_whole_stream():
    config = CONFIGS[1]
    n = 37 * 50 * 4                            # whole groups, whole epochs
    whole = events(config, n)
    for kind, name in ((PERSON, "persons"), (AUCTION, "auctions"), (BID, "bids")):
        count = nx.kind_count(config, name, n)
        assert count == sum(e["event_type"] == kind for e in whole)
        alone = vectorized(name, config, range(count))
        key = lambda r: (r["date_time"], sorted(r.items(), key=str))  # noqa: E731
        assert sorted(alone, key=key) == sorted(ref.of_kind(whole, kind), key=key)


# ===================================================================== the model
def test_proportions_are_1_3_46_per_50_events():
    config = NexmarkConfig(out_of_order_group_size=10)
    batch = nx.events(config, vectorized=True)(np.arange(100_000))
    kinds = batch.column("event_type").to_numpy()
    assert np.bincount(kinds).tolist() == [2000, 6000, 92000]
    assert [nx.kind_count(config, k, 100_000) for k in ("persons", "auctions", "bids")] == [2000, 6000, 92000]
    assert [nx.kind_count(config, k, 52) for k in ("persons", "auctions", "bids")] == [2, 4, 46]
    # every kind's own columns are set, the others' null
    for kind, prefix in ((PERSON, "person_"), (AUCTION, "auction_"), (BID, "bid_")):
        mine = batch.filter(pa.array(kinds == kind))
        for name in batch.schema.names[2:]:
            assert mine.column(name).null_count == (0 if name.startswith(prefix) else mine.num_rows), name


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("kind", nx.KINDS)
def test_timestamps_are_ms_from_the_base_and_in_order_up_to_the_out_of_orderness(config, kind):
    n = 20_000
    ts = getattr(nx, kind)(config, vectorized=True)(np.arange(n)).column("date_time").to_numpy()
    assert ts.dtype == np.int64 and ts.min() >= config.first_event_ms
    lateness = (np.maximum.accumulate(ts) - ts).max()
    assert lateness <= config.out_of_orderness_ms(kind)
    if config.out_of_order_group_size == 1:
        assert lateness == 0
    else:
        assert lateness > 0
    if kind == "events":                        # 1 / events_per_second apart (over whole groups)
        whole = n - n % config.out_of_order_group_size
        assert ts[:whole].max() - config.first_event_ms == (whole - 1) * 1000 // config.events_per_second


def test_timestamps_follow_the_rate():
    config = NexmarkConfig(events_per_second=4, first_event_ms=10_000)
    assert [e["date_time"] for e in events(config, 6)] == [10_000, 10_250, 10_500, 10_750, 11_000, 11_250]
    assert NexmarkConfig(events_per_second=1000, out_of_order_group_size=11).out_of_orderness_ms() == 10


@pytest.mark.parametrize("config", CONFIGS[:2])
def test_ids_are_consecutive_and_bids_refer_to_recent_auctions_and_persons(config):
    stream = events(config, 50_000)
    persons, auctions = ref.of_kind(stream, PERSON), ref.of_kind(stream, AUCTION)
    assert sorted(p["id"] for p in persons) == list(range(1000, 1000 + len(persons)))
    assert sorted(a["id"] for a in auctions) == list(range(1000, 1000 + len(auctions)))
    # in the order emitted: ids lead the newest created by at most ID_LEAD (+ a shuffled group)
    slack = nx.ID_LEAD + config.out_of_order_group_size
    last_person = last_auction = 999
    existing = 0
    for e in stream:
        if e["event_type"] == PERSON:
            last_person = max(last_person, e["person_id"])
        elif e["event_type"] == AUCTION:
            last_auction = max(last_auction, e["auction_id"])
            assert 1000 <= e["auction_seller"] <= last_person + slack
            assert e["auction_expires"] > e["date_time"] and e["auction_reserve"] > e["auction_initial_bid"] > 0
            assert 10 <= e["auction_category"] < 15
        else:
            low_auction = max(1000, last_auction - config.num_in_flight_auctions - slack)
            low_person = max(1000, last_person - config.num_active_people - slack)
            assert low_auction <= e["bid_auction"] <= last_auction + slack
            assert low_person <= e["bid_bidder"] <= last_person + slack
            existing += e["bid_auction"] <= last_auction and e["bid_bidder"] <= last_person
    assert existing / nx.kind_count(config, "bids", 50_000) > 0.85     # most refer to what exists already


def test_hot_auctions_bidders_and_channels_take_their_share():
    bids = vectorized("bids", NexmarkConfig(), range(46 * 100 * 20))  # 20 batches of 100 auctions
    hot = sum(b["auction"] == (b["auction"] - 1000) // 100 * 100 + 1000 for b in bids) / len(bids)
    assert 0.5 <= hot <= 0.56                   # 1 - 1/hot_auction_ratio, + random ones landing there
    hot_channels = sum(b["channel"] in nx.HOT_CHANNELS for b in bids) / len(bids)
    assert 0.47 <= hot_channels <= 0.53
    assert all(b["url"].startswith("https://www.nexmark.com/") and 10**2 <= b["price"] <= 10**8 for b in bids)
    persons = vectorized("persons", NexmarkConfig(), range(2000))
    assert {p["state"] for p in persons} == set(nx.US_STATES)
    assert all(len(p["credit_card"]) == 19 and "@" in p["email_address"] for p in persons)
    sizes = [len(b["extra"]) for b in bids]
    assert 54 <= min(sizes) and max(sizes) <= 81 and 65 <= np.mean(sizes) <= 71
    assert {b["extra"] for b in vectorized("bids", NexmarkConfig(pad_extra=False), range(100))} == {""}


# ===================================================================== as a source
def test_the_generator_source_emits_the_stream_over_splits():
    config = CONFIGS[1]
    whole = events(config, 3000)
    for source in (nx.source(config, count=3000, batch_size=128),
                   ss.sources.Generator(nx.events(config), count=3000, schema=nx.SCHEMA)):
        assert source.schema.equals(nx.SCHEMA)
        got = {}
        for j, split in enumerate(source.splits(3)):
            reader = source.create_reader(OperatorContext(
                name="nexmark", uid="nexmark", subtask_index=j, parallelism=3, max_parallelism=128,
                attempt=0, job_id="job", task_name=f"nexmark ({j + 1}/3)"))
            reader.assign_splits([split])
            reader.open()
            emitted = []
            while not reader.is_finished():
                batch = reader.poll()
                emitted += batch.to_pylist() if isinstance(batch, pa.RecordBatch) else batch
            got.update(zip(range(j, 3000, 3), emitted))
        assert [got[i] for i in range(3000)] == whole
    assert nx.source(config, kind="bids").schema.equals(nx.BID_SCHEMA)


# ===================================================================== configuration
@pytest.mark.parametrize("field, value", [
    ("seed", "7"), ("seed", 1.0), ("events_per_second", 0), ("events_per_second", 2.5),
    ("first_event_ms", -1), ("num_active_people", 0), ("num_in_flight_auctions", 2**31),
    ("hot_auction_ratio", 0), ("hot_sellers_ratio", True), ("hot_bidders_ratio", None),
    ("out_of_order_group_size", 0), ("out_of_order_group_size", 953),
    ("out_of_order_group_size", 4), ("person_proportion", 0),
    ("auction_proportion", -3), ("bid_proportion", "46"), ("pad_extra", 1),
])
def test_a_bad_config_names_the_field(field, value):
    with pytest.raises(ConfigurationError, match=rf"NexmarkConfig\.{field} must"):
        NexmarkConfig(**{field: value})


def test_bad_arguments_are_refused():
    with pytest.raises(ConfigurationError, match="NexmarkConfig"):
        nx.events({"seed": 1})
    with pytest.raises(ConfigurationError, match="kind must be one of"):
        nx.source(NexmarkConfig(), kind="bid")
    with pytest.raises(ConfigurationError, match="kind must be"):
        nx.kind_count(NexmarkConfig(), "events", 10)


# ===================================================================== reference queries
def person(t, id, name="P", city="Boise", state="ID"):
    return event(PERSON, t, id=id, name=name, city=city, state=state)


def auction(t, id, seller=0, category=10, expires=None, reserve=0):
    return event(AUCTION, t, id=id, seller=seller, category=category, expires=expires, reserve=reserve)


def bid(t, auction, price, bidder=0, extra=""):
    return event(BID, t, auction=auction, bidder=bidder, price=price, extra=extra)


def test_q0_q1_q2_pass_convert_and_select_bids():
    events = [person(0, 1), bid(5, 1107, 100, bidder=1), auction(1, 7), bid(6, 1000, 200, bidder=2, extra="x")]
    assert ref.q0(events) == [(1000, 2, 200, 6, "x"), (1107, 1, 100, 5, "")]
    assert ref.q1(events) == [(1000, 2, pytest.approx(181.6), 6, "x"), (1107, 1, pytest.approx(90.8), 5, "")]
    assert ref.q2(events) == [(1107, 100)]      # 1107 = 9 * 123


def test_q3_joins_local_sellers_with_category_10_auctions_in_any_order():
    events = [auction(0, 103, seller=3), auction(0, 100, seller=1), auction(0, 101, seller=2),
              auction(0, 102, seller=3, category=11), auction(0, 104, seller=99),
              person(1, 1, "A", "Portland", "OR"), person(1, 2, "B", "Seattle", "WA"),
              person(1, 3, "C", "Los Angeles", "CA")]
    assert ref.q3(events) == [("A", "Portland", "OR", 100), ("C", "Los Angeles", "CA", 103)]


def test_q4_averages_the_final_price_of_auctions_per_category():
    events = [auction(1000, 1, category=10, expires=2000, reserve=50),
              auction(1000, 2, category=10, expires=1500, reserve=500),
              auction(0, 3, category=11, expires=100), auction(0, 4, category=12, expires=100),
              bid(1000, 1, 40), bid(2000, 1, 70), bid(2001, 1, 900),        # bounds inclusive; after: no
              bid(1200, 2, 300), bid(1400, 2, 100), bid(999, 2, 999),       # before: no
              bid(50, 3, 5), bid(50, 9, 1_000_000)]                          # unknown auction: no
    assert ref.q4(events) == [(10, 185.0), (11, 5.0)]                      # (70 + 300) / 2
    assert ref.q4(events, require_reserve=True) == [(10, 70.0), (11, 5.0)]


def test_q5_lists_the_auctions_with_most_bids_per_sliding_window():
    events = [bid(0, 1, 1), bid(1, 1, 1), bid(1, 2, 1), bid(2, 2, 1), bid(3, 2, 1), bid(4, 3, 1), bid(5, 3, 1)]
    assert ref.q5(events, size_ms=4, slide_ms=2) == [
        (-2, 2, 1, 2), (0, 4, 2, 3), (2, 6, 2, 2), (2, 6, 3, 2), (4, 8, 3, 2)]   # ties all listed
    assert list(ref.window_starts(10_000, 10_000, 2_000)) == [10_000, 8_000, 6_000, 4_000, 2_000]
    assert list(ref.window_starts(-1, 10, 5)) == [-5, -10]                   # aligned to the epoch
    assert ref.q5([bid(10_000, 7, 1)]) == [(s, s + 10_000, 7, 1) for s in range(2_000, 10_001, 2_000)]


def test_q7_gives_the_highest_bids_per_tumbling_window():
    events = [bid(0, 1, 5, bidder=1), bid(9_999, 2, 9, bidder=2), bid(5_000, 3, 9, bidder=3),
              bid(10_000, 4, 7, bidder=4)]
    assert ref.q7(events) == [(0, 10_000, 2, 2, 9, 9_999), (0, 10_000, 3, 3, 9, 5_000),
                              (10_000, 20_000, 4, 4, 7, 10_000)]


def test_q8_finds_persons_who_sold_in_the_window_they_registered():
    events = [person(1_000, 1, "A"), person(9_000, 2, "B"), person(12_000, 3, "C"),
              auction(5_000, 10, seller=1), auction(6_000, 11, seller=1), auction(10_000, 12, seller=2),
              auction(19_999, 13, seller=3), auction(1_000, 14, seller=4)]
    assert ref.q8(events) == [(1, "A", 0), (3, "C", 10_000)]


def test_the_references_run_on_generated_events():
    config = NexmarkConfig(events_per_second=1000, out_of_order_group_size=10)
    generated = events(config, 30_000)
    answers = {name: q(generated) for name, q in ref.QUERIES.items()}
    assert len(answers["q0"]) == len(answers["q1"]) == 27_600
    assert all(auction_id % 123 == 0 for auction_id, _ in answers["q2"]) and answers["q2"]
    assert answers["q3"] and all(state in ("OR", "ID", "CA") for _, _, state, _ in answers["q3"])
    assert [category for category, _ in answers["q4"]] == [10, 11, 12, 13, 14]
    assert answers["q5"] and answers["q7"] and answers["q8"]
    assert ref.q0(generated[::-1]) == answers["q0"]     # order does not matter
