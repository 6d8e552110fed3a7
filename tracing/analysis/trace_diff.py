"""Compare two traces step by step: where do two forward passes part ways?

Two traces are *aligned* before they are compared. Each step gets a key that does not
depend on its index —

    (kind, module, op, call, occurrence)

where ``call`` is which call of the module it ran in (0 for the first) and ``occurrence``
counts earlier steps with the same ``(kind, module, op, call)``. The two key sequences are
then aligned like two texts with :class:`difflib.SequenceMatcher`, so the same model on two
prompts, two versions of a model (one with an extra op), or a checkpoint before and after
training line up, and a step present on one side only is reported as such, never dropped.

For each aligned pair the outputs are compared position by position: a shape or dtype
change, and when both traces kept values, the maximum absolute difference, the relative L2
difference ``||a - b|| / ||a||`` and the cosine similarity. When only statistics were
captured, the largest change of min / max / mean / std is reported instead (a weaker signal:
equal statistics do not prove equal tensors).

>>> d = tracing.diff(trace_a, trace_b)            # doctest: +SKIP
>>> d.first_divergence(atol=1e-6).label           # doctest: +SKIP
'blocks.1.feed_forward.linear1 · linear'
>>> print(d.render("md"))                         # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

from tracing import markdown
from tracing.formatting import format_number, format_shape, step_number
from tracing.sites import StepKey, step_keys

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from tracing.record import Step, TensorRecord, Trace

DiffStatus = Literal["equal", "changed", "shape", "only_a", "only_b"]

# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class TensorDiff:
    """One output of one aligned step, compared across the two traces.

    ``max_abs``, ``rel_l2`` and ``cosine`` are ``None`` when either side kept no values or
    the shapes differ. ``stats_delta`` is the largest change of min/max/mean/std when both
    sides have statistics (``None`` otherwise).
    """

    name: str
    shape_a: tuple[int, ...] | None
    shape_b: tuple[int, ...] | None
    dtype_a: str | None = None
    dtype_b: str | None = None
    max_abs: float | None = None
    rel_l2: float | None = None
    cosine: float | None = None
    stats_delta: float | None = None

    @property
    def shape_changed(self) -> bool:
        return self.shape_a != self.shape_b or self.dtype_a != self.dtype_b

    @property
    def compared(self) -> bool:
        """True when the values themselves were compared (not only shapes or stats)."""
        return self.max_abs is not None

    def differs(self, atol: float = 0.0) -> bool:
        """Whether this output differs by more than ``atol`` (by the best evidence kept)."""
        if self.shape_changed:
            return True
        if self.max_abs is not None:
            return not self.max_abs <= atol  # NaN counts as a difference
        if self.stats_delta is not None:
            return not self.stats_delta <= atol
        return False


@dataclass(frozen=True)
class StepDiff:
    """One entry of the alignment: a pair of steps, or a step present on one side only."""

    status: DiffStatus
    key: StepKey
    a_index: int | None  # index into trace A's steps, None when only in B
    b_index: int | None
    outputs: tuple[TensorDiff, ...] = ()
    order: float = 0.0  # when the step's outputs exist in execution order (see _output_order)

    @property
    def kind(self) -> str:
        return self.key[0]

    @property
    def module(self) -> str:
        return self.key[1]

    @property
    def op(self) -> str:
        return self.key[2]

    @property
    def label(self) -> str:
        """``blocks.1.feed_forward.linear1 · linear`` (``<root>`` for the root module)."""
        return f"{self.module or '<root>'} · {self.op}"

    @property
    def one_sided(self) -> bool:
        return self.status in ("only_a", "only_b")

    @property
    def max_abs(self) -> float | None:
        """Largest ``max_abs`` over the outputs compared (None if none was compared)."""
        vals = [o.max_abs for o in self.outputs if o.max_abs is not None]
        return _nanmax(vals) if vals else None

    @property
    def rel_l2(self) -> float | None:
        vals = [o.rel_l2 for o in self.outputs if o.rel_l2 is not None]
        return _nanmax(vals) if vals else None

    @property
    def cosine(self) -> float | None:
        """Smallest cosine similarity over the outputs compared."""
        vals = [o.cosine for o in self.outputs if o.cosine is not None]
        if not vals:
            return None
        return float("nan") if any(math.isnan(v) for v in vals) else min(vals)

    def differs(self, atol: float = 0.0) -> bool:
        if self.one_sided:
            return True
        return any(o.differs(atol) for o in self.outputs)


@dataclass
class TraceDiff:
    """The aligned comparison of two traces. ``entries`` follow the alignment order."""

    entries: list[StepDiff] = field(default_factory=list)
    meta_a: dict = field(default_factory=dict)
    meta_b: dict = field(default_factory=dict)
    trace_a: Trace | None = field(default=None, repr=False, compare=False)
    trace_b: Trace | None = field(default=None, repr=False, compare=False)

    # ---- queries

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def counts(self) -> dict[str, int]:
        """How many entries of each status: ``{"equal": 410, "changed": 2, ...}``."""
        c = Counter(e.status for e in self.entries)
        return {s: c.get(s, 0) for s in ("equal", "changed", "shape", "only_a", "only_b")}

    @property
    def identical(self) -> bool:
        return all(e.status == "equal" for e in self.entries)

    def divergent(self, atol: float = 0.0) -> list[StepDiff]:
        """Every entry that differs by more than ``atol``, in execution order."""
        return sorted((e for e in self.entries if e.differs(atol)), key=lambda e: e.order)

    def first_divergence(self, atol: float = 0.0) -> StepDiff | None:
        """The earliest step, in execution order, whose outputs differ by more than ``atol``.

        Execution order means the moment an output came to exist: an op at its own index,
        a module call at its end (module steps are recorded at entry, but their outputs only
        exist once every op inside has run). So when one weight changes, the first
        divergence is the op that used it, not the root module that encloses it.
        """
        div = self.divergent(atol)
        return div[0] if div else None

    def for_step_a(self, index: int) -> StepDiff | None:
        """The entry holding step ``index`` of trace A (for synchronised stepping)."""
        return self._by_side("a").get(index)

    def for_step_b(self, index: int) -> StepDiff | None:
        return self._by_side("b").get(index)

    def _by_side(self, side: str) -> dict[int, StepDiff]:
        cache_name = f"_by_{side}"
        cached = self.__dict__.get(cache_name)
        if cached is None:
            attr = f"{side}_index"
            cached = {getattr(e, attr): e for e in self.entries if getattr(e, attr) is not None}
            self.__dict__[cache_name] = cached
        return cached

    def difference(self, entry: StepDiff, output: int = 0) -> torch.Tensor | None:
        """``A - B`` for one output of an aligned step (the app's difference heatmap).

        ``None`` when the step is on one side only, the shapes differ, or a side kept no
        value. Computed in float32 (float64 stays float64).
        """
        import torch

        if entry.one_sided or self.trace_a is None or self.trace_b is None:
            return None
        sa = self.trace_a.steps[entry.a_index]
        sb = self.trace_b.steps[entry.b_index]
        if output >= min(len(sa.outputs), len(sb.outputs)):
            return None
        va = self.trace_a.value(sa.outputs[output])
        vb = self.trace_b.value(sb.outputs[output])
        if va is None or vb is None or va.shape != vb.shape:
            return None
        dtype = torch.float64 if torch.float64 in (va.dtype, vb.dtype) else torch.float32
        return va.to(dtype) - vb.to(dtype)

    def module_scores(self) -> dict[str, float | None]:
        """A divergence score per module path, for colouring diagram boxes.

        The score is the largest relative L2 difference of that module's own call outputs
        (0 = identical). ``inf`` when the module ran on one side only or its output shape
        changed; ``None`` when nothing could be compared (no values, no stats).
        """
        scores: dict[str, float | None] = {}
        for e in self.entries:
            if e.kind != "module":
                continue
            if e.one_sided or any(o.shape_changed for o in e.outputs):
                s: float | None = math.inf
            else:
                s = e.rel_l2
                if s is None:
                    deltas = [o.stats_delta for o in e.outputs if o.stats_delta is not None]
                    s = _nanmax(deltas) if deltas else None
            prev = scores.get(e.module)
            scores[e.module] = s if prev is None else (prev if s is None else _nanmax([prev, s]))
        return scores

    # ---- rendering (computing is kept apart from formatting)

    def to_dict(self) -> dict:
        """Plain JSON-ready data (non-finite floats as the strings "inf", "nan")."""
        first = self.first_divergence()
        return {
            "counts": self.counts(),
            "first_divergence": None if first is None else _entry_dict(first),
            "module_scores": {k: _json_float(v) for k, v in self.module_scores().items()},
            "entries": [_entry_dict(e) for e in self.entries],
            "meta_a": _meta_summary(self.meta_a),
            "meta_b": _meta_summary(self.meta_b),
        }

    def render(self, fmt: str = "md", *, atol: float = 0.0, all_steps: bool = False) -> str:
        """The comparison as Markdown (``"md"``) or JSON (``"json"``).

        Markdown lists only the steps that differ by more than ``atol`` unless
        ``all_steps``; JSON always has every entry.
        """
        from tracing.safe_text import inert_document

        if fmt == "json":
            return json.dumps(self.to_dict(), indent=2)  # ASCII: every control escaped
        if fmt in ("md", "markdown"):  # names from the files: control characters escaped
            return inert_document(_render_md(self, atol=atol, all_steps=all_steps))
        raise ValueError(f"unknown diff format {fmt!r}: expected 'md' or 'json'")


# --------------------------------------------------------------------------- alignment


def _output_order(trace: Trace) -> list[float]:
    """When each step's outputs come to exist: an op at its index, a module at its end."""
    order = [float(s.index) for s in trace.steps]
    for s in trace.steps:
        if s.kind == "module":
            end = s.end
            if end is None:  # a call that never finished (partial trace): after its ops
                end = max((t.index for t in trace.steps if t.parent == s.index), default=s.index)
            order[s.index] = end + 0.5
    return order


def diff(a: Trace, b: Trace) -> TraceDiff:
    """Align two traces and compare every aligned step's outputs. See the module doc."""
    keys_a, keys_b = step_keys(a), step_keys(b)
    order_a, order_b = _output_order(a), _output_order(b)
    matcher = difflib.SequenceMatcher(None, keys_a, keys_b, autojunk=False)
    entries: list[StepDiff] = []
    cache: dict[tuple[int, int], TensorDiff] = {}  # a module's output is often its last op's
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for i, j in zip(range(i1, i2), range(j1, j2)):
                outs = _compare_outputs(a, a.steps[i], b, b.steps[j], cache)
                entries.append(StepDiff(_status(outs), keys_a[i], i, j, outs, order=order_a[i]))
            continue
        # replace / delete / insert: steps on one side only, A's first (in A's order)
        for i in range(i1, i2):
            outs = tuple(_one_side(a, t, side="a") for t in _named_outputs(a.steps[i]))
            entries.append(StepDiff("only_a", keys_a[i], i, None, outs, order=order_a[i]))
        # B-only steps sit where they would be in A's order: just before the next A step
        anchor = order_a[i2] - 0.25 if i2 < len(order_a) else (order_a[-1] + 1 if a.steps else 0)
        for j in range(j1, j2):
            outs = tuple(_one_side(b, t, side="b") for t in _named_outputs(b.steps[j]))
            span = order_b[j]  # keeps B-only steps in their own order
            entries.append(StepDiff("only_b", keys_b[j], None, j, outs, order=anchor + span * 1e-9))
    return TraceDiff(entries, dict(a.meta), dict(b.meta), trace_a=a, trace_b=b)


# --------------------------------------------------------------------------- comparing


def _named_outputs(step: Step) -> list[tuple[str, int]]:
    names = step.output_names if len(step.output_names) == len(step.outputs) else ()
    return [(names[k] if names else f"output[{k}]", tid) for k, tid in enumerate(step.outputs)]


def _one_side(trace: Trace, named: tuple[str, int], side: str) -> TensorDiff:
    name, tid = named
    rec = trace.tensors[tid]
    if side == "a":
        return TensorDiff(name, tuple(rec.shape), None, rec.dtype, None)
    return TensorDiff(name, None, tuple(rec.shape), None, rec.dtype)


def _compare_outputs(
    a: Trace, sa: Step, b: Trace, sb: Step, cache: dict[tuple[int, int], TensorDiff]
) -> tuple[TensorDiff, ...]:
    outs_a, outs_b = _named_outputs(sa), _named_outputs(sb)
    result = []
    for k in range(max(len(outs_a), len(outs_b))):
        if k >= len(outs_b):
            result.append(_one_side(a, outs_a[k], "a"))
        elif k >= len(outs_a):
            result.append(_one_side(b, outs_b[k], "b"))
        else:
            name, tid_a = outs_a[k]
            tid_b = outs_b[k][1]
            known = cache.get((tid_a, tid_b))
            if known is None:
                known = cache[tid_a, tid_b] = _compare_tensor(a, outs_a[k], b, tid_b)
            elif known.name != name:
                known = dataclasses.replace(known, name=name)
            result.append(known)
    return tuple(result)


def _compare_tensor(a: Trace, named: tuple[str, int], b: Trace, tid_b: int) -> TensorDiff:
    name, tid_a = named
    ra, rb = a.tensors[tid_a], b.tensors[tid_b]
    shape_a, shape_b = tuple(ra.shape), tuple(rb.shape)
    stats_delta = _stats_delta(ra, rb)
    if shape_a != shape_b:
        return TensorDiff(name, shape_a, shape_b, ra.dtype, rb.dtype, stats_delta=stats_delta)
    va, vb = a.value(ra.id), b.value(rb.id)
    if va is None or vb is None or tuple(va.shape) != tuple(vb.shape):
        return TensorDiff(name, shape_a, shape_b, ra.dtype, rb.dtype, stats_delta=stats_delta)
    max_abs, rel_l2, cosine = tensor_metrics(va, vb)
    return TensorDiff(
        name, shape_a, shape_b, ra.dtype, rb.dtype, max_abs, rel_l2, cosine, stats_delta
    )


def tensor_metrics(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """``(max_abs, rel_l2, cosine)`` of two same-shaped tensors, computed in float64.

    Positions where both sides hold the same value (including the same Inf, or NaN on both
    sides) count as equal, so a trace compared with itself is all zero even with NaNs.
    ``rel_l2`` is ``||a - b|| / ||a||`` (``0`` if both are zero, ``inf`` if only ``a`` is);
    ``cosine`` is ``1`` for two zero tensors and ``0`` when only one is zero.
    """
    import torch

    x = a.detach().to("cpu", torch.float64).flatten()
    y = b.detach().to("cpu", torch.float64).flatten()
    if x.numel() == 0:
        return 0.0, 0.0, 1.0
    if bool(torch.isfinite(x).all()) and bool(torch.isfinite(y).all()):
        d = x - y  # the common case: a few passes over the data
        max_abs = float(d.abs().max())
        return max_abs, *_norm_metrics(x, y, d)
    # NaN / Inf present: equal positions (same Inf, NaN on both sides) count as equal
    same = (x == y) | (torch.isnan(x) & torch.isnan(y))
    d = torch.where(same, torch.zeros_like(x), x - y)
    d = torch.where(torch.isnan(d), torch.full_like(d, math.inf), d)  # NaN vs number
    max_abs = float(d.abs().max())
    finite = torch.isfinite(x) & torch.isfinite(y)
    rel_l2, cosine = _norm_metrics(x[finite], y[finite], d[finite])
    if not bool(same[~finite].all()):
        rel_l2 = math.inf  # a non-finite value on one side only
    return max_abs, rel_l2, cosine


def _norm_metrics(x: torch.Tensor, y: torch.Tensor, d: torch.Tensor) -> tuple[float, float]:
    """``(rel_l2, cosine)`` from finite float64 vectors and their difference ``d``."""
    import torch

    na, nb, nd = float(x.norm()), float(y.norm()), float(d.norm())
    rel_l2 = nd / na if na > 0 else (0.0 if nd == 0 else math.inf)
    if na == 0 and nb == 0:
        cosine = 1.0
    elif na == 0 or nb == 0:
        cosine = 0.0
    else:
        cosine = max(-1.0, min(1.0, float(torch.dot(x, y)) / (na * nb)))
    return rel_l2, cosine


def _stats_delta(ra: TensorRecord, rb: TensorRecord) -> float | None:
    sa, sb = ra.stats, rb.stats
    if sa is None or sb is None:
        return None
    deltas = [
        _float_delta(sa.min, sb.min),
        _float_delta(sa.max, sb.max),
        _float_delta(sa.mean, sb.mean),
        _float_delta(sa.std, sb.std),
        float(abs(sa.nan - sb.nan)),
        float(abs(sa.inf - sb.inf)),
    ]
    return _nanmax(deltas)


def _float_delta(x: float, y: float) -> float:
    if x == y or (math.isnan(x) and math.isnan(y)):
        return 0.0
    d = abs(x - y)
    return math.inf if math.isnan(d) else d


def _status(outs: tuple[TensorDiff, ...]) -> DiffStatus:
    if any(o.shape_changed for o in outs):
        return "shape"
    if any(o.differs(0.0) for o in outs):
        return "changed"
    return "equal"


def _nanmax(vals: list[float]) -> float:
    return float("nan") if any(math.isnan(v) for v in vals) else max(vals)


# --------------------------------------------------------------------------- formatting


def _json_float(v: float | None) -> float | str | None:
    if v is None or math.isfinite(v):
        return v
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def _entry_dict(e: StepDiff) -> dict:
    outs = []
    for o in e.outputs:
        d = asdict(o)
        for k in ("max_abs", "rel_l2", "cosine", "stats_delta"):
            d[k] = _json_float(d[k])
        d["shape_a"] = None if o.shape_a is None else list(o.shape_a)
        d["shape_b"] = None if o.shape_b is None else list(o.shape_b)
        outs.append(d)
    return {
        "status": e.status,
        "kind": e.kind,
        "module": e.module,
        "op": e.op,
        "call": e.key[3],
        "occurrence": e.key[4],
        "a_index": e.a_index,
        "b_index": e.b_index,
        "outputs": outs,
    }


def _meta_summary(meta: dict) -> dict:
    keep = ("model_class", "capture", "text", "tokens", "torch_version")
    return {k: meta[k] for k in keep if k in meta and _is_jsonable(meta[k])}


def _is_jsonable(v) -> bool:
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        return False
    return True


def _num(v: float | None, digits: int = 3) -> str:
    return format_number(v, digits)


def _render_md(d: TraceDiff, *, atol: float, all_steps: bool) -> str:
    c = d.counts()
    lines = ["# Trace diff", ""]
    for side, meta in (("A", d.meta_a), ("B", d.meta_b)):
        summary = _meta_summary(meta)
        desc = ", ".join(f"{k}: {v}" for k, v in summary.items() if k != "tokens")
        lines.append(f"- **{side}**: {desc or '(no metadata)'}")
    lines += [
        "",
        f"{len(d)} aligned entries: {c['equal']} equal, {c['changed']} changed values, "
        f"{c['shape']} changed shape, {c['only_a']} only in A, {c['only_b']} only in B.",
        "",
    ]
    first = d.first_divergence(atol)
    if first is None:
        lines.append(f"No divergence above atol={atol:g}.")
    else:
        a, b = first.a_index, first.b_index  # step numbers, as the compare window counts
        where = f"A#{step_number(a)}" if a is not None else f"B#{step_number(b)}"
        lines.append(
            f"First divergence (atol={atol:g}): **{first.label}** ({where}, {first.status})."
        )
    lines += ["", "## Steps", ""]
    header = ["A", "B", "status", "kind", "module", "op", "output", "shape A", "shape B"]
    header += ["max abs", "rel L2", "cosine"]
    shown = d.entries if all_steps else [e for e in d.entries if e.differs(atol)]
    rows = [
        [
            "–" if e.a_index is None else str(step_number(e.a_index)),
            "–" if e.b_index is None else str(step_number(e.b_index)),
            e.status,
            e.kind,
            markdown.code(e.module or "<root>"),
            markdown.code(e.op),
            markdown.escape(o.name),
            format_shape(o.shape_a),
            format_shape(o.shape_b),
            _num(o.max_abs),
            _num(o.rel_l2),
            _num(o.cosine, 6),
        ]
        for e in shown
        for o in e.outputs or (TensorDiff("–", None, None),)
    ]
    lines += markdown.table(header, rows)
    if not shown:
        lines.append("| | | | | | | | | | | | |")
    scores = d.module_scores()
    if scores:
        lines += ["", "## Modules (largest relative L2 of their outputs)", ""]
        rows = [[markdown.code(path or "<root>"), _num(s)] for path, s in scores.items()]
        lines += markdown.table(["module", "score"], rows)
    return "\n".join(lines) + "\n"
