"""What the diagram needs to know about a trace, computed once: structure, data flow, repetition.

Plain Python (no Qt), so it can be tested and measured on its own. A :class:`TraceIndex`
is built when a trace is shown and answers, in time that does not grow with the whole trace:

- ``children(parent)``: the steps directly inside a module call (``None``: the top level);
- ``runs(parent)``: where those children repeat — a cell called 8,000 times in a loop
  (period 1, one module path), ``blocks.0`` … ``blocks.47`` (period 1, one structure, paths
  differing only in their numbers), ``mul, add, mul, add, …`` (period 2). Two steps repeat
  each other when their *structural signature* matches: kind, op, module path with numbers
  as ``#``, and (for a module call) the signatures of everything inside it;
- ``sources(i)`` / ``external(i)``: where a step's inputs (or a whole call's inputs from
  outside it) come from — the last step that handed the tensor on before it ran;
- ``fold_sources(parent, start, stop)``: the same for a run of siblings, with numpy scans
  over per-group arrays instead of a Python loop over thousands of members.

Everything is computed lazily and cached, so opening a trace costs one pass over its steps
(the signatures) and each box drawn costs only what is inside it.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from tracing import Trace

#: stands for "a model input" in source lists (the diagram's input box)
MODEL_INPUT = -1

#: a run folds into one box from this many repetitions on (fewer stay separate boxes)
FOLD_MIN = 16
#: longest repeating pattern looked for (``[select → cell]`` is 2)
MAX_PERIOD = 6

_NUMBER = re.compile(r"(?<=\.)\d+(?=\.|$)")


@dataclass(frozen=True)
class Run:
    """``count`` repetitions of a ``period``-long pattern among one parent's children.

    ``start``/``stop`` are positions among the siblings (stop exclusive);
    ``period == 0`` marks a plain range of positions (a page of a long group) instead.
    """

    parent: int | None
    start: int
    stop: int
    period: int

    @property
    def count(self) -> int:
        return (self.stop - self.start) // self.period if self.period else self.stop - self.start

    def member_span(self, k: int) -> tuple[int, int]:
        """Sibling positions of the ``k``-th repetition."""
        p = self.period or 1
        return self.start + k * p, self.start + (k + 1) * p

    def member_of(self, position: int) -> int:
        return (position - self.start) // (self.period or 1)


class _Group:
    """Per-parent arrays for :meth:`TraceIndex.fold_sources` (built on first use)."""

    def __init__(self, index: TraceIndex, parent: int | None):
        kids = index.children(parent)
        n = len(kids)
        self.min_ref = np.full(n, n, dtype=np.int64)  # smallest sibling position referenced
        self.refs: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # (position, source)
        outer: dict[int, list[int]] = {}  # source from outside the group -> positions using it
        lo = -1 if parent is None else parent
        for j, child in enumerate(kids):
            for src in index.external(child):
                if src == MODEL_INPUT or src <= lo:
                    outer.setdefault(src, []).append(j)
                    continue
                q = index.position_under(src, parent)
                if q is None or q >= j:
                    continue
                self.refs[j].append((q, src))
                if q < self.min_ref[j]:
                    self.min_ref[j] = q
        self.outer = {src: positions for src, positions in outer.items()}


class TraceIndex:
    """Structure, data flow and repetition of one trace, for the diagram (see module doc)."""

    def __init__(self, trace: Trace):
        self.trace = trace
        steps = trace.steps
        self.n = len(steps)
        self._children: dict[int | None, list[int]] = {}
        self.position = [0] * self.n  # place among its siblings
        for s in steps:
            if s.kind == "backward":  # not part of the forward's structure
                continue
            kids = self._children.setdefault(s.parent, [])
            self.position[s.index] = len(kids)
            kids.append(s.index)
        self.last = [s.end if s.end is not None and s.end >= s.index else s.index for s in steps]
        self.signature = self._signatures()
        self._runs: dict[int | None, list[Run]] = {}
        self._run_starts: dict[int | None, list[int]] = {}
        self._groups: dict[int | None, _Group] = {}
        self._sources: dict[int, tuple[int, ...]] = {}
        self._external: dict[int, tuple[int, ...]] = {}
        self._handed_on: dict[int, list[int]] | None = None
        self.root_inputs = self._root_inputs()

    # ---- structure

    def children(self, parent: int | None) -> list[int]:
        return self._children.get(parent, [])

    def has_children(self, index: int) -> bool:
        return index in self._children

    def position_under(self, index: int, parent: int | None) -> int | None:
        """Position among ``parent``'s children of the ancestor-or-self of step ``index``."""
        steps = self.trace.steps
        seen = 0
        while index is not None and seen <= self.n:
            up = steps[index].parent
            if up == parent:
                return self.position[index]
            index = up
            seen += 1
        return None

    def _signatures(self) -> list[int]:
        """Bottom-up structural ids: equal ids mean "the same computation again"."""
        steps = self.trace.steps
        table: dict[tuple, int] = {}
        paths: dict[str, str] = {}  # module path -> the same with numbers as "#"
        children = self._children
        sig = [0] * self.n
        for s in reversed(steps):
            path = paths.get(s.module)
            if path is None:
                path = paths[s.module] = _NUMBER.sub("#", s.module)
            kids = children.get(s.index)
            key = (s.kind, s.op, path, tuple([sig[c] for c in kids]) if kids else ())
            sig[s.index] = table.setdefault(key, len(table))
        return sig

    # ---- repetition

    def runs(self, parent: int | None) -> list[Run]:
        """Non-overlapping runs of at least :data:`FOLD_MIN` repetitions, in order."""
        if parent not in self._runs:
            sigs = [self.signature[c] for c in self.children(parent)]
            self._runs[parent] = [Run(parent, s, e, p) for s, e, p in find_runs(sigs)]
            self._run_starts[parent] = [r.start for r in self._runs[parent]]
        return self._runs[parent]

    def runs_within(self, parent: int | None, lo: int, hi: int) -> list[Run]:
        """The runs of ``parent`` clipped to positions ``[lo, hi)`` (still long enough)."""
        runs = self.runs(parent)
        first = max(0, bisect_right(self._run_starts[parent], lo) - 1)
        out = []
        for run in runs[first:]:
            if run.start >= hi:
                break
            p = run.period
            start = run.start + -(-(max(run.start, lo) - run.start) // p) * p
            stop = start + ((min(run.stop, hi) - start) // p) * p
            if stop > start and (stop - start) // p >= FOLD_MIN:
                out.append(Run(parent, start, stop, p))
        return out

    def span_steps(self, parent: int | None, start: int, stop: int) -> tuple[int, int]:
        """First and last step index covered by sibling positions ``[start, stop)``."""
        kids = self.children(parent)
        return kids[start], self.last[kids[stop - 1]]

    # ---- data flow

    def _root_inputs(self) -> set[int]:
        trace = self.trace
        out = set()
        for i in self.children(None):
            for tid in trace.steps[i].inputs:
                rec = trace.tensors[tid]
                if rec.producer is None and rec.role != "param":
                    out.add(tid)
        return out

    def source_of(self, tid: int, consumer: int) -> int | None:
        """The step that last handed tensor ``tid`` on before step ``consumer`` ran.

        A dropout in eval mode returns its input unchanged, so the next block hangs below
        the dropout, not beside it; a module call counts as handing a tensor on once it has
        returned. :data:`MODEL_INPUT` for a model input, None for a parameter or buffer.
        """
        if self._handed_on is None:
            handed: dict[int, list[int]] = {}
            for st in self.trace.steps:
                for t in st.outputs:
                    handed.setdefault(t, []).append(st.index)
            self._handed_on = handed
        steps = self.trace.steps
        handed = self._handed_on.get(tid, ())
        if len(handed) == 1 and handed[0] < consumer and steps[handed[0]].kind != "module":
            return handed[0]  # the common case: made by one op, used later
        for i in reversed(handed):
            st = steps[i]
            if st.kind == "module":
                if st.end is not None and st.end < consumer and st.parent is not None:
                    return i
            elif i < consumer:
                return i
        producer = self.trace.tensors[tid].producer
        if producer is None:
            return MODEL_INPUT if tid in self.root_inputs else None
        return producer if 0 <= producer < self.n else None

    def sources(self, index: int) -> tuple[int, ...]:
        """Where step ``index``'s own inputs come from (no Nones)."""
        cached = self._sources.get(index)
        if cached is None:
            found: list[int] = []
            for t in self.trace.steps[index].inputs:
                src = self.source_of(t, index)
                if src is not None and src not in found:
                    found.append(src)
            cached = self._sources[index] = tuple(found)
        return cached

    def external(self, index: int) -> tuple[int, ...]:
        """Sources of everything inside call ``index`` that lie outside it (its own too)."""
        cached = self._external.get(index)
        if cached is None:
            lo, hi = index, self.last[index]
            found: dict[int, None] = {}
            for j in range(lo, hi + 1):
                for src in self.sources(j):
                    if src == MODEL_INPUT or src < lo or src > hi:
                        found[src] = None
            cached = tuple(found)
            self._external[index] = cached
        return cached

    def fold_sources(self, parent: int | None, start: int, stop: int) -> set[int]:
        """Sources from outside sibling positions ``[start, stop)`` used inside them."""
        group = self._groups.get(parent)
        if group is None:
            group = self._groups[parent] = _Group(self, parent)
        found: set[int] = set()
        for src, positions in group.outer.items():
            k = bisect_left(positions, start)
            if k < len(positions) and positions[k] < stop:
                found.add(src)
        for j in np.flatnonzero(group.min_ref[start:stop] < start) + start:
            found.update(src for q, src in group.refs[int(j)] if q < start)
        return found


def find_runs(sigs: list[int], min_count: int = FOLD_MIN) -> list[tuple[int, int, int]]:
    """``(start, stop, period)`` of maximal repeats of a pattern in ``sigs``, left to right.

    At each position the period (1 … :data:`MAX_PERIOD`) covering the most elements wins,
    the shorter one on a tie; a run needs ``min_count`` repetitions. Linear in practice:
    a position that starts no run is passed after at most ``MAX_PERIOD`` short checks.
    """
    n = len(sigs)
    out: list[tuple[int, int, int]] = []
    i = 0
    while i < n:
        best_len, best_p = 0, 0
        for p in range(1, MAX_PERIOD + 1):
            if i + p * min_count > n:
                break
            j = i + p
            while j < n and sigs[j] == sigs[j - p]:
                j += 1
            count = (j - i) // p
            if count >= min_count and count * p > best_len:
                best_len, best_p = count * p, p
        if best_p:
            out.append((i, i + best_len, best_p))
            i += best_len
        else:
            i += 1
    return out
