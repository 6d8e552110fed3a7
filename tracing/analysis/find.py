"""Find anything in a trace: one index over what it holds, built once, asked many times.

:class:`FindIndex` reads a trace once (linear in its steps and tensors) and answers a query
with :class:`FindResult`: the matching *entries* grouped by kind, each entry a thing that
can be named once and found at one or more steps:

==============  ==========================================================================
kind            an entry is ... (matched against)
==============  ==========================================================================
``nonfinite``   ``nan``, ``inf``, ``non-finite``: where it went non-finite (the one
                definition, :func:`tracing.breakpoints.iter_origins`) and every step whose
                output holds NaN or Inf; for these words it ranks first
``step``        a step number: ``#412`` or ``412`` (1-based, as the step bar counts:
                :func:`tracing.formatting.step_index`)
``site``        a site as edits spell it (:mod:`tracing.sites`): ``blocks.1.attn:softmax#0``,
                ``blocks.0@1``, ``blocks.0@1:add#1``; the steps it names
``module``      a module of the model (its dotted path and its type); its calls
``op``          an op name (``softmax``, ``matmul``, ``MmBackward0``); the steps that ran it
``source``      a source line (``attention.py:78``: that line, not 780; and its text); the
                steps called from it
``tensor``      a tensor's name at a step (``x``, ``mask``, ``output[1]``); where it appears
``shape``       a shape, its dims and both (``(1, 4, 12, 12)``, ``(B, H, T, T)``); where
                a tensor of that shape comes out
==============  ==========================================================================

Groups come in that order (:attr:`FindResult.kinds`): a person who types ``nan`` looks for
where the values went bad, not for a module or a file whose name starts with ``Nan``, so
the non-finite steps come first, and Enter in the app goes to them first
(:meth:`FindResult.first_from`).

Matching is a case-insensitive substring test (spaces around commas do not matter, so
``B,H,T,T`` finds ``(B, H, T, T)``). Distinct names are few even in a 50,000-step loop, so a
query scans one joined text per kind with ``str.find`` and costs what the distinct names
cost, not what the steps cost. ``FindResult.steps`` (every matching step, sorted) is what
F3 walks, built on first use.

No Qt here: the app's find box and ``scratchformer find`` both read this.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import PurePath
from typing import TYPE_CHECKING

from tracing.formatting import format_shape, step_index
from tracing.sites import parse_site, site_steps

if TYPE_CHECKING:  # pragma: no cover
    from tracing.record import Trace

KINDS: tuple[str, ...] = (
    "nonfinite", "step", "site", "module", "op", "source", "tensor", "shape",
)  # fmt: skip
KIND_TITLES = {
    "step": "Steps",
    "site": "Sites",
    "module": "Modules",
    "op": "Ops",
    "source": "Source lines",
    "tensor": "Tensor names",
    "shape": "Shapes and dims",
    "nonfinite": "Non-finite",
}
_STEP_NUMBER = re.compile(r"^#?\s*(\d+)$")
_SITE_MARK = re.compile(r"@\d+|:[A-Za-z_][\w.]*#\d+$")  # what makes a query a site, not a path
_LINE_END = re.compile(r"\.py:\d+$")
_COMMA = re.compile(r"\s*,\s*")
_NONFINITE_WORDS = "nan inf non-finite nonfinite not finite"


def normalise(text: str) -> str:
    """What matching compares: lower case, ``a,b`` and ``a , b`` as ``a, b``."""
    return _COMMA.sub(", ", text.strip().lower())


@dataclass(frozen=True)
class Entry:
    """One thing found: a module, an op name, a source line, a shape ... and its steps."""

    kind: str
    label: str  # what the list shows: "h.7.attn (GPT2Attention)", "attention.py:78 · q @ k"
    steps: tuple[int, ...]  # sorted step indices where it is; () for a module that never ran

    @property
    def first(self) -> int | None:
        return self.steps[0] if self.steps else None


@dataclass
class FindResult:
    """The answer to one query: entries by kind (in :data:`KINDS` order), and all steps."""

    query: str
    groups: dict[str, list[Entry]] = field(default_factory=dict)

    @property
    def kinds(self) -> list[str]:
        """The kinds that matched, best first (:data:`KINDS` order)."""
        return [kind for kind in KINDS if self.groups.get(kind)]

    @property
    def entries(self) -> list[Entry]:
        return [e for kind in self.kinds for e in self.groups[kind]]

    def first_from(self, current: int) -> int | None:
        """Where Enter goes first: the first match at or after ``current``, among the
        non-finite steps when there are some (``nan``, ``inf``: ranked first), wrapping
        round; None for no match."""
        nonfinite = self.groups.get("nonfinite")
        if nonfinite:  # where it went non-finite first, then any step holding NaN or Inf
            for entry in nonfinite:
                i = bisect_left(entry.steps, current)
                if i < len(entry.steps):
                    return entry.steps[i]
            return nonfinite[0].steps[0]
        return self.next_after(current - 1)

    def count(self, kind: str) -> int:
        return len(self.groups.get(kind, ()))

    def __bool__(self) -> bool:
        return any(self.groups.values())

    @cached_property
    def steps(self) -> list[int]:
        """Every step any entry points at, sorted, once each (what F3 walks)."""
        found: set[int] = set()
        for entries in self.groups.values():
            for e in entries:
                found.update(e.steps)
        return sorted(found)

    def next_after(self, current: int) -> int | None:
        """The first matching step after ``current``, wrapping round; None for no match."""
        steps = self.steps
        if not steps:
            return None
        i = bisect_right(steps, current)
        return steps[i] if i < len(steps) else steps[0]

    def previous_before(self, current: int) -> int | None:
        """The last matching step before ``current``, wrapping round; None for no match."""
        steps = self.steps
        if not steps:
            return None
        i = bisect_left(steps, current)
        return steps[i - 1] if i > 0 else steps[-1]


class _Table:
    """Distinct keys of one kind, their labels and steps, and one joined text to search."""

    def __init__(self, kind: str, keys: dict[str, tuple[str, list[int]]]):
        self.kind = kind
        self.labels = [label for label, _ in keys.values()]
        self.steps = [tuple(sorted(set(steps))) for _, steps in keys.values()]
        texts = [normalise(k) for k in keys]
        self.starts: list[int] = []
        at = 0
        for t in texts:
            self.starts.append(at)
            at += len(t) + 1
        self.blob = "\n".join(texts)

    def search(self, query: str) -> list[Entry]:
        out: list[Entry] = []
        blob, starts, find = self.blob, self.starts, self.blob.find
        pos = find(query)
        while pos >= 0:
            i = bisect_right(starts, pos) - 1
            out.append(Entry(self.kind, self.labels[i], self.steps[i]))
            nxt = starts[i + 1] if i + 1 < len(starts) else len(blob)
            pos = find(query, nxt)
        return out


class FindIndex:
    """Everything a trace holds that a person may look for, indexed once (linear)."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.n_steps = len(trace.steps)
        module: dict[str, tuple[str, list[int]]] = {}
        for path, info in trace.modules.items():
            name = path or "<root>"
            module[f"{name} {info.type}"] = (f"{name} ({info.type})", [])
        op: dict[str, tuple[str, list[int]]] = {}
        source: dict[str, tuple[str, list[int]]] = {}
        tensor: dict[str, tuple[str, list[int]]] = {}
        shape: dict[str, tuple[str, list[int]]] = {}
        bad: list[int] = []
        tensors = trace.tensors
        shape_keys: dict[tuple, str] = {}  # (shape, dims) -> its key, formatted once
        file_names: dict[str, str] = {}
        for step in trace.steps:
            i = step.index
            if step.kind == "module":
                info = trace.modules.get(step.module)
                name = step.module or "<root>"
                key = f"{name} {info.type if info else step.op}"
                entry = module.get(key)
                if entry is None:
                    entry = module[key] = (f"{name} ({info.type if info else step.op})", [])
                entry[1].append(i)
            else:
                entry = op.get(step.op)
                if entry is None:
                    entry = op[step.op] = (step.op, [])
                entry[1].append(i)
            loc = step.source
            if loc is not None:
                fname = file_names.get(loc.file)
                if fname is None:
                    fname = file_names[loc.file] = PurePath(loc.file).name if loc.file else "?"
                key = f"{fname}:{loc.line} · {loc.text}"  # " ·" ends the line number
                entry = source.get(key)
                if entry is None:
                    entry = source[key] = (key.removesuffix(" · "), [])
                entry[1].append(i)
            for name in step.input_names:
                entry = tensor.get(name)
                if entry is None:
                    entry = tensor[name] = (name, [])
                entry[1].append(i)
            for name in step.output_names:
                entry = tensor.get(name)
                if entry is None:
                    entry = tensor[name] = (name, [])
                entry[1].append(i)
            nonfinite = False
            for tid in step.outputs:
                record = tensors[tid]
                seen = (record.shape, record.dims)
                key = shape_keys.get(seen)
                if key is None:
                    plain = format_shape(record.shape, None)
                    if record.dims is not None and len(record.dims) == len(record.shape):
                        dims = "(" + ", ".join(record.dims) + ")"
                        key = f"{format_shape(record.shape, record.dims)} {dims} {plain}"
                        label = f"{dims} {plain}"
                    else:
                        key = label = plain
                    shape_keys[seen] = key
                    if key not in shape:
                        shape[key] = (label, [])
                shape[key][1].append(i)
                stats = record.stats
                if stats is not None and (stats.nan or stats.inf):
                    nonfinite = True
            if nonfinite:
                bad.append(i)
        self.tables = {
            "module": _Table("module", module),
            "op": _Table("op", op),
            "source": _Table("source", source),
            "tensor": _Table("tensor", tensor),
            "shape": _Table("shape", shape),
        }
        self.nonfinite_steps = tuple(bad)
        self._origins: tuple[int, ...] | None = None

    @property
    def origins(self) -> tuple[int, ...]:
        """Steps where it went non-finite (computed on the first query that asks)."""
        if self._origins is None:
            from tracing.breakpoints import iter_origins

            self._origins = tuple(hit.step for hit in iter_origins(self.trace))
        return self._origins

    def search(self, query: str) -> FindResult:
        """Every entry whose text holds ``query`` (case-insensitive); empty for ""."""
        q = normalise(query)
        result = FindResult(query)
        if not q:
            return result
        number = _STEP_NUMBER.match(q)
        if number is not None:
            n = int(number.group(1))
            if 1 <= n <= self.n_steps:
                i = step_index(n)
                step = self.trace.steps[i]
                result.groups["step"] = [Entry("step", f"#{n} {step.label}", (i,))]
            if q.startswith("#"):
                return result  # "#412" means the step, nothing else
        site = self._site(query)
        if site is not None:
            result.groups["site"] = [site]
        line = q + " ·" if _LINE_END.search(q) else q  # "x.py:78" is line 78, not 780
        for kind, table in self.tables.items():
            found = table.search(line if kind == "source" else q)
            if found:
                result.groups[kind] = found
        if q in _NONFINITE_WORDS and len(q) >= 3 and self.nonfinite_steps:
            entries = []
            if self.origins:
                entries.append(Entry("nonfinite", "went non-finite here", self.origins))
            entries.append(Entry("nonfinite", "output holds NaN or Inf", self.nonfinite_steps))
            result.groups["nonfinite"] = entries
        return result

    def _site(self, query: str) -> Entry | None:
        """The steps a query spelled as a site names (``blocks.1.attn:softmax#0``,
        ``blocks.0@1``), as edits read it; None when the query is not one."""
        text = query.strip()
        if not _SITE_MARK.search(text):
            return None
        try:
            site = parse_site(text)
        except ValueError:
            return None
        steps = tuple(s.index for s in site_steps(self.trace, site))
        return Entry("site", str(site), steps) if steps else None


__all__ = ["KINDS", "KIND_TITLES", "Entry", "FindIndex", "FindResult", "normalise"]
