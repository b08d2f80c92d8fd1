"""What users put in state comes back as it was, with its type, through a checkpoint."""

import datetime as dt
import zoneinfo
from dataclasses import dataclass, field
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.properties import examples

from streamsnap.state import KeyGroupRange, ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from streamsnap.state.errors import StateSerializationError
from streamsnap.state.serialization import DATACLASS_EXT, pack_value, unpack_value

FULL = KeyGroupRange(0, 127)


@dataclass
class Reading:
    sensor: str
    at: dt.datetime
    values: tuple = ()
    tags: frozenset = frozenset()


@dataclass(frozen=True)
class Money:
    amount: Decimal
    currency: str = "EUR"


@dataclass
class Counted:
    """`__post_init__` must not run on restore: the value is what was stored, not re-derived."""

    n: int
    doubled: int = field(init=False, default=0)

    def __post_init__(self):
        self.doubled = self.n * 2


def same(a, b) -> bool:
    """Equal, of the same type, all the way down (1 == 1.0 == True, [1] vs (1,) are not the same)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, Decimal):
        return str(a) == str(b)   # NaN != NaN; -0.00 == 0 but is not the same value
    if isinstance(a, (dt.datetime, dt.time)):
        return a == b and a.tzinfo == b.tzinfo and a.fold == b.fold and (a.tzinfo is None or a.tzname() == b.tzname())
    if isinstance(a, (Reading, Money, Counted)):
        return all(same(getattr(a, f), getattr(b, f)) for f in vars(a)) if not isinstance(a, Money) else \
            same(a.amount, b.amount) and a.currency == b.currency
    return a == b


ZONES = st.one_of(
    st.none(),
    st.just(dt.timezone.utc),
    st.builds(lambda minutes: dt.timezone(dt.timedelta(minutes=minutes)), st.integers(-23 * 60, 23 * 60)),
    st.builds(lambda minutes: dt.timezone(dt.timedelta(minutes=minutes), "Local"), st.integers(-600, 600)),
    st.sampled_from([zoneinfo.ZoneInfo(k) for k in ("Europe/Berlin", "America/New_York", "Asia/Kolkata")]),
)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1), st.floats(allow_nan=False), st.text(max_size=8),
    st.binary(max_size=8),
    st.datetimes(timezones=ZONES, allow_imaginary=False),
    st.dates(), st.times(timezones=ZONES), st.timedeltas(),
    st.decimals(allow_nan=True, places=None), st.decimals(places=3, allow_nan=False),
)
HASHABLE = st.recursive(SCALARS.filter(lambda v: not isinstance(v, Decimal) or not v.is_nan()),
                        lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3), max_leaves=6)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=4), inner, max_size=3),
        st.sets(HASHABLE, max_size=3), st.frozensets(HASHABLE, max_size=3),
        st.builds(Reading, st.text(max_size=4), st.datetimes(timezones=ZONES, allow_imaginary=False),
                  st.tuples(inner), st.frozensets(st.integers(-100, 100), max_size=3)),
        st.builds(Money, st.decimals(places=2, allow_nan=False)),
    ),
    max_leaves=8,
)


@settings(max_examples=examples(200))
@given(VALUES)
def test_values_round_trip_with_their_types(value):
    assert same(unpack_value(pack_value(value)), value)


def test_the_types_users_put_in_state_come_back_as_they_were():
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    values = [
        dt.datetime(2024, 3, 31, 1, 59, 59, 999999),                       # naive stays naive
        dt.datetime(2024, 10, 27, 2, 30, tzinfo=berlin, fold=1),             # the second 02:30 (CET)
        dt.datetime(2024, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30), "IST")),
        dt.date(1, 1, 1), dt.time(23, 59, 59, 1, tzinfo=dt.timezone.utc), dt.timedelta(days=-3, microseconds=7),
        Decimal("-0.00"), Decimal("1E+400"), Decimal("sNaN"),
        (1, (2, [3, (4,)])), {1, (2, 3)}, frozenset({"a"}), b"\x00raw",
        Reading("s1", dt.datetime(2024, 1, 1, tzinfo=berlin), (1.5, None), frozenset({3})),
        Money(Decimal("9.99")),
    ]
    back = unpack_value(pack_value(values))
    for before, after in zip(values, back):
        assert type(after) is type(before), (before, after)
        assert str(after) == str(before) if isinstance(before, Decimal) else after == before
    assert back[1].fold == 1 and back[1].tzinfo is berlin and back[1].utcoffset() == dt.timedelta(hours=1)
    assert back[2].tzname() == "IST" and back[4].tzinfo is dt.timezone.utc


def test_a_restored_dataclass_is_the_stored_value_not_a_new_construction():
    stored = Counted(2)
    stored.doubled = 5                       # changed after construction
    back = unpack_value(pack_value(stored))
    assert type(back) is Counted and back.n == 2 and back.doubled == 5


def test_a_dataclass_that_cannot_be_imported_on_restore_names_it_and_the_fix():
    import msgpack

    payload = pack_value(["tests.state.no_such_module:Gone", {"x": 1}])
    with pytest.raises(StateSerializationError, match=r"'tests.state.no_such_module.Gone'.*importable where the job runs"):
        unpack_value(msgpack.packb(msgpack.ExtType(DATACLASS_EXT, payload)))
    payload = pack_value(["datetime:date", {"x": 1}])   # a class, but not a dataclass
    with pytest.raises(StateSerializationError, match=r"'datetime.date' as a dataclass.*without @dataclass"):
        unpack_value(msgpack.packb(msgpack.ExtType(DATACLASS_EXT, payload)))


def test_state_values_round_trip_through_a_checkpoint_of_each_backend(location, new_backend):
    berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    reading = Reading("s1", dt.datetime(2024, 5, 1, 12, tzinfo=berlin), (1, 2), frozenset({7}))
    backend = new_backend(FULL)
    value = backend.get_state(ValueStateDescriptor("last"))
    listing = backend.get_state(ListStateDescriptor("seen"))
    mapping = backend.get_state(MapStateDescriptor("by_day"))
    backend.set_current_key("k", 3)
    value.update(reading)
    listing.add_all([dt.date(2024, 5, 1), Decimal("0.10"), {1, 2}])
    mapping.put("2024-05-01", (dt.timedelta(hours=1), Money(Decimal("1.50"))))
    handle = backend.snapshot(1, location).run()
    again = new_backend(FULL)
    again.restore([handle], location)
    again.set_current_key("k", 3)
    assert same(again.get_state(ValueStateDescriptor("last")).value(), reading)
    assert [type(v) for v in again.get_state(ListStateDescriptor("seen")).get()] == [dt.date, Decimal, set]
    restored = again.get_state(MapStateDescriptor("by_day")).get("2024-05-01")
    assert type(restored) is tuple and restored == (dt.timedelta(hours=1), Money(Decimal("1.50")))


def test_pooled_packers_survive_a_failed_pack_and_pack_from_many_threads_at_once():
    """`pack_value` reuses this thread's Packers (a nested value takes another one): a value
    that fails midway leaves no partial bytes in what is packed next, and threads packing at
    the same time each get their own values back."""
    import threading

    nested = {"a": (1, (2, frozenset({3})), [dt.date(2026, 11, 29)]), "b": Reading("s", dt.datetime(2026, 1, 1))}
    with pytest.raises(TypeError, match="can not serialize"):
        pack_value([(1, 2), {"x": (3, object())}])         # fails inside a nested tuple
    assert same(unpack_value(pack_value(nested)), nested)
    assert pack_value(nested) == pack_value(nested)

    results, errors = {}, []

    def work(i):
        try:
            values = [(i, j, (str(i), j)) for j in range(2_000)]
            results[i] = all(same(unpack_value(pack_value(v)), v) for v in values)
        except Exception as exc:       # reported below: a thread's exception is otherwise lost
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and results == {i: True for i in range(6)}
