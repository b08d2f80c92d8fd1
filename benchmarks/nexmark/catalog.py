"""Every Nexmark query q0-q22 on streamsnap, by name, and how each one's output compares with
`reference`: `QUERIES[name](stream)` builds the query on the flat event stream of
`queries.events(...)`; `output_tuples(name, rows)` turns its output rows into the reference's
sorted tuples.

The queries live by family: `queries` (q0-q5, q7, q8), `closed_auctions` (q6, q9), `stateless`
(q10, q14, q21, q22), `bidder_windows` (q11, q12), `joins` (q13, q20), `reports` (q15-q17),
`ranking` (q18, q19). Updating results (q4, q6, q18, q19) are reduced to their final value per
key: the row with the most closed auctions (q4, q6), the last row emitted per key (q18, q19 —
a key's rows come from one subtask, in order).
"""

from __future__ import annotations

from benchmarks.nexmark import (bidder_windows, closed_auctions, joins, queries, ranking, reports,
                                stateless)

QUERIES = {**queries.QUERIES, "q6": closed_auctions.q6, "q9": closed_auctions.q9, "q10": stateless.q10,
           "q11": bidder_windows.q11, "q12": bidder_windows.q12, "q13": joins.q13, "q14": stateless.q14,
           "q15": reports.q15, "q16": reports.q16, "q17": reports.q17, "q18": ranking.q18, "q19": ranking.q19,
           "q20": joins.q20, "q21": stateless.q21, "q22": stateless.q22}
QUERIES = dict(sorted(QUERIES.items(), key=lambda item: int(item[0][1:])))

OUTPUT_FIELDS = {
    **queries.OUTPUT_FIELDS,
    "q6": ("seller", "average"),
    "q9": closed_auctions.WINNING_BID_SCHEMA.names,
    "q10": tuple(stateless.Q10_SCHEMA.names),
    "q11": bidder_windows.Q11_FIELDS,
    "q13": tuple(joins.Q13_SCHEMA.names),
    "q14": tuple(stateless.Q14_SCHEMA.names),
    "q15": tuple(reports.Q15_SCHEMA.names),
    "q16": tuple(reports.Q16_SCHEMA.names),
    "q17": tuple(reports.Q17_SCHEMA.names),
    "q18": ("auction", "bidder", "price", "channel", "url", "date_time", "extra"),
    "q19": ("auction", "rank", "bidder", "price", "date_time"),
    "q20": tuple(joins.Q20_SCHEMA.names),
    "q21": tuple(stateless.Q21_SCHEMA.names),
    "q22": tuple(stateless.Q22_SCHEMA.names),
}
LAST_PER_KEY = {"q18": ("bidder", "auction"), "q19": ("auction", "rank")}
MOST_CLOSED = {"q4": ("category", "auctions"), "q6": ("seller", "auctions")}


def output_tuples(query: str, rows) -> list[tuple]:
    """A query's output rows as the reference's sorted tuples (updating results: the final
    value per key). q12's output is not a function of the input (wall-clock windows): compare
    it with `bids_per_bidder` instead."""
    if query in MOST_CLOSED:
        key, closed = MOST_CLOSED[query]
        final: dict = {}
        for r in rows:
            if r[closed] > final.get(r[key], {closed: 0})[closed]:
                final[r[key]] = r
        rows = final.values()
    elif query in LAST_PER_KEY:
        rows = {tuple(r[f] for f in LAST_PER_KEY[query]): r for r in rows}.values()
    fields = OUTPUT_FIELDS[query]
    return sorted(tuple(r[f] for f in fields) for r in rows)


def bids_per_bidder(rows) -> dict[int, int]:
    """q12's windows added up per bidder."""
    totals: dict[int, int] = {}
    for r in rows:
        totals[r["bidder"]] = totals.get(r["bidder"], 0) + r["bid_count"]
    return totals
