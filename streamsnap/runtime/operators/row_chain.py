"""Fused per-row chains: chained `map` / `filter` / `flat_map` operators run as one loop per batch.

Why: unfused, each of a chain's per-row operators loops over the whole batch and builds a list
for the next one — per row and operator, a list append and a pass through a loop of our own.
Fused, a row goes through every function of the run in one iteration of one loop and lands in
the last operator's output list; nothing between the operators is materialized (the word
count's `flat_map` → `map` → `filter` makes three lists per batch unfused, one fused).

A run is a sequence of per-row function operators in which each operator's output has exactly
one target, the next operator of the run (no side outputs, no second consumer: those still get
the batch unfused). Only the data path is fused: each operator keeps its lifecycle (open, close,
checkpoints, state), watermarks and statuses pass through every operator's `Output` as before,
`records_in` / `records_out` are counted per operator, and a failing function is reported by
its own operator with the row it was given (`user_error`). The functions see the same rows in
the same order as unfused; only the interleaving differs (unfused, every row of a batch has
passed the first function before any reaches the second; fused, row by row, as Flink's chained
operators do).

An operator that is not fused runs as a run of one, so fused and unfused share one loop. The
loop is generated once per sequence of kinds from fixed fragments (no user text enters it): a
`try` costs nothing in Python ≥ 3.11 until something raises, so each function call gets its own.
"""

from __future__ import annotations

from streamsnap.errors import UsageError, UserFunctionError
from streamsnap.runtime.batches import Batch, to_rows
from streamsnap.runtime.operators.base import user_error

KINDS = ("map", "filter", "flat_map")
_MAP_RESULT = "map function returned {}; it must return a dict (a row)"
_FLAT_ITEM = "function produced {}; rows must be dicts"
_LOOPS: dict[tuple, object] = {}


class RowRun:
    """One loop over a batch through `operators` (per-row function operators, each the only
    target of the one before); results go to the last operator's output."""

    __slots__ = ("operators", "_functions", "_loop")

    def __init__(self, operators: list):
        kinds = tuple(op.kind for op in operators)
        for op, kind in zip(operators, kinds):
            if kind not in KINDS:
                raise ValueError(f"operator '{op.ctx.name}' of kind {kind!r} cannot be fused; "
                                 f"only {', '.join(KINDS)} can")
        self.operators = operators
        self._functions = tuple(op.function for op in operators)
        self._loop = _loop_for(kinds)

    def process(self, batch: Batch) -> None:
        rows = to_rows(batch)
        operators = self.operators
        operators[0].records_in += len(rows)
        out: list = []
        counts = self._loop(rows, self._functions, out.append, self._fail)
        for k, count in enumerate(counts, start=1):
            operators[k].records_in += count
            operators[k - 1].output.records_out += count
        operators[-1].output.emit(out)

    def _fail(self, stage: int, row, exc: BaseException) -> UserFunctionError:
        return user_error(self.operators[stage], row, exc)


def fuse_row_chains(operators: list) -> list[RowRun]:
    """Give the first operator of every run of two or more fusable operators (see the module
    docstring) the run as its `run`; `operators` in topological order (a task's chain, head
    first), their outputs wired. Returns the runs."""
    runs, taken = [], set()
    for op in operators:
        if id(op) in taken or getattr(op, "kind", None) not in KINDS:
            continue
        members = [op]
        while True:
            output = members[-1].output
            targets = output._targets if output is not None else []
            if len(targets) != 1 or output._side or getattr(targets[0], "kind", None) not in KINDS:
                break
            members.append(targets[0])
        if len(members) > 1:
            run = RowRun(members)
            op.run = run
            runs.append(run)
            taken.update(id(m) for m in members)
    return runs


def _loop_for(kinds: tuple):
    loop = _LOOPS.get(kinds)
    if loop is None:
        loop = _LOOPS[kinds] = _compile(kinds)
    return loop


def _compile(kinds: tuple):
    """`loop(rows, functions, append, fail) -> counts`: every row through the functions in
    turn, what the last one yields appended; counts: the rows that reached operators 1, 2, …
    (`fail(stage, row, exc)` makes the error of the operator at `stage`)."""
    n = len(kinds)
    body = ["def loop(rows, functions, append, fail):",
            f"    {''.join(f'f{k}, ' for k in range(n))}= functions",
            "    c0 = len(rows)"]
    count = ["c0"]   # count[k]: the variable counting the rows that reached stage k
    lines: list[tuple[int, str]] = [(1, "for r0 in rows:")]
    depth = 2
    for k, kind in enumerate(kinds):
        row, nxt = f"r{k}", f"r{k + 1}"
        last = k == n - 1     # what the last operator passes on is counted by its output
        counted = f"c{k + 1}"
        bump = [] if last else [(depth + (2 if kind == "flat_map" else 0), f"{counted} += 1")]
        if kind == "map":
            lines += [(depth, "try:"), (depth + 1, f"{nxt} = f{k}({row})"),
                      (depth, "except Exception as exc:"), (depth + 1, f"raise fail({k}, {row}, exc) from None"),
                      (depth, f"if type({nxt}) is not dict:"),
                      (depth + 1, f"raise fail({k}, {row}, UsageError(MAP_RESULT.format(type({nxt}).__name__)))")]
            count.append(count[k])       # a map passes every row on
            continue
        if not last:
            body.append(f"    {counted} = 0")
        count.append(counted)
        if kind == "filter":
            lines += [(depth, "try:"), (depth + 1, f"if not f{k}({row}):"), (depth + 2, "continue"),
                      (depth, "except Exception as exc:"), (depth + 1, f"raise fail({k}, {row}, exc) from None"),
                      (depth, f"{nxt} = {row}")] + bump
            continue
        # flat_map: None, one dict or an iterable of dicts; iterating may run the user's code (a
        # generator), so the loop over its results is inside the operator's try — whose handler
        # lets the errors of the operators after it through.
        lines += [(depth, "try:"), (depth + 1, f"result{k} = f{k}({row})"),
                  (depth, "except Exception as exc:"), (depth + 1, f"raise fail({k}, {row}, exc) from None"),
                  (depth, f"if result{k} is None:"), (depth + 1, "continue"),
                  (depth, f"if type(result{k}) is dict:"), (depth + 1, f"result{k} = (result{k},)"),
                  (depth, "try:"), (depth + 1, f"for {nxt} in result{k}:"),
                  (depth + 2, f"if type({nxt}) is not dict:"),
                  (depth + 3, f"raise UsageError(FLAT_ITEM.format(type({nxt}).__name__))")] + bump
        handlers = [(depth, "except UserFunctionError:"), (depth + 1, "raise"),
                    (depth, "except Exception as exc:"), (depth + 1, f"raise fail({k}, {row}, exc) from None")]
        depth += 2
        lines.append((None, handlers))   # closed after the stages nested in its loop
    lines.append((depth, f"append(r{n})"))
    # Close the flat_maps' try blocks, innermost first.
    text, pending = [], []
    for indent, line in lines:
        if indent is None:
            pending.append(line)
        else:
            text.append("    " * indent + line)
    for handlers in reversed(pending):
        text += ["    " * indent + line for indent, line in handlers]
    body += text
    body.append(f"    return ({''.join(f'{c}, ' for c in count[1:n])})")
    # Frames of this "module" are left out of the user's traceback (base.user_error).
    scope = {"__name__": __name__, "UserFunctionError": UserFunctionError, "TypeError": TypeError, "UsageError": UsageError,
             "Exception": Exception, "len": len, "type": type, "dict": dict,
             "MAP_RESULT": _MAP_RESULT, "FLAT_ITEM": _FLAT_ITEM}
    exec(compile("\n".join(body), f"<streamsnap row chain {' -> '.join(kinds)}>", "exec"), scope)  # noqa: S102
    return scope["loop"]
