"""Activation patching sweeps: which heads, layers or positions carry the answer?

Run the model on a *clean* input and on a *corrupted* one (a changed token), then run the
corrupted input again many times, each time with one site's value taken from the clean run.
A site whose patch brings the clean prediction back is where the information lives.

>>> result = sweep(model, clean_ids, corrupted_ids, over="heads")   # doctest: +SKIP
>>> result.values.shape          # (layers, heads)                   # doctest: +SKIP
>>> print(result.to_csv())                                            # doctest: +SKIP

``over``:

- ``"heads"``: one run per (layer, head), patching that head's output (the attention
  weights times the values, ``(B, H, T, D)``, before the heads are merged);
- ``"layers"``: one run per block, patching its whole output (the residual stream);
- ``"positions"``: one run per (block, position), patching the residual stream at one
  position after that block (causal tracing's layer × position map);
- a list of sites (``"blocks.1.feed_forward"``, ``Edit`` objects...): one run each.

The sites are found in one ``shapes`` trace of the clean run, by what the model did, not by
its names: attention maps are recognised by the tracer, and the blocks are the longest list
of numbered children. The clean values are kept once, from one clean run; each patched run
is a plain forward with hooks on one module only (:func:`tracing.edit_run.run_edited`).

The default metric is the *logit difference* at the last position between the clean run's
prediction and the corrupted run's (its best token other than the clean one): high when the
clean answer wins. ``result.clean_metric`` and ``result.corrupted_metric`` are the two ends.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tracing.capture.edits import Action, Edit, EditError, EditPlan, Patch, as_edit
from tracing.capture.heads import (
    consumers_of,
    folded_heads,
    head_site_of_map,
    head_sites_in,
    heads_folded_at,
)
from tracing.runs.edit_run import run_edited
from tracing.sites import Site

Metric = Callable[[Any], float]


@dataclass
class SweepResult:
    """A table of the metric: one row per layer (or site), one column per head/position."""

    over: str
    rows: list[str]
    columns: list[str]
    values: torch.Tensor  # (rows, columns), float64; NaN where not run (cancelled, no site)
    edits: list[list[Edit | None]]  # the edit of each cell
    clean_metric: float
    corrupted_metric: float
    metric_name: str = "metric"
    cancelled: bool = False
    seconds: float = 0.0
    runs: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def normalized(self) -> torch.Tensor:
        """``(value - corrupted) / (clean - corrupted)``: 1 = the patch restores the clean
        metric fully, 0 = it does nothing."""
        span = self.clean_metric - self.corrupted_metric
        if span == 0:
            return torch.full_like(self.values, math.nan)
        return (self.values - self.corrupted_metric) / span

    def best(self) -> tuple[str, str, float] | None:
        """(row, column, value) of the largest value."""
        finite = torch.nan_to_num(self.values, nan=-math.inf)
        if not torch.isfinite(finite).any():
            return None
        flat = int(torch.argmax(finite))
        r, c = divmod(flat, self.values.shape[1])
        return self.rows[r], self.columns[c], float(self.values[r, c])

    def to_csv(self) -> str:
        """The table as CSV: a header of column labels, a row label then the values."""
        out = io.StringIO()
        out.write(",".join([_csv(self.over), *(_csv(c) for c in self.columns)]) + "\n")
        for label, row in zip(self.rows, self.values.tolist()):
            cells = ["" if math.isnan(v) else repr(round(v, 9)) for v in row]
            out.write(",".join([_csv(label), *cells]) + "\n")
        return out.getvalue()


def _csv(text: str) -> str:
    return f'"{text}"' if any(ch in text for ch in ',"\n') else text


# --------------------------------------------------------------------------- metric


def output_logits(output: Any) -> torch.Tensor:
    """The logits in a model's output: the tensor itself, ``.logits`` / ``["logits"]`` (HF),
    or the first tensor of a tuple (``(logits, loss)``)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("logits"), torch.Tensor):
        return output["logits"]
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor):
                return item
    raise EditError(f"cannot find logits in the model's output ({type(output).__name__})")


def logit_difference(
    clean_output: Any, corrupted_output: Any, token_label: Callable[[int], str] | None = None
) -> tuple[Metric, str]:
    """The default metric: logit of the clean prediction minus that of the corrupted
    run's best other token, at the last position of the first batch row; and its name
    (``logit['d'] - logit['k']`` with a ``token_label``, ``logit[100] - ...`` without)."""
    clean = output_logits(clean_output)[0, -1]
    corrupted = output_logits(corrupted_output)[0, -1]
    right = int(clean.argmax())
    ranked = corrupted.argsort(descending=True).tolist()
    wrong = next(t for t in ranked if t != right)

    def metric(output: Any) -> float:
        last = output_logits(output)[0, -1]
        return float(last[right] - last[wrong])

    def name(token: int) -> str:
        return repr(token_label(token)) if token_label is not None else str(token)

    return metric, f"logit[{name(right)}] - logit[{name(wrong)}]"


# --------------------------------------------------------------------------- sites


def head_sites(trace) -> list[tuple[Site, int]]:
    """(site, output index) of each attention layer's per-head output ``(B, H, T, D)``, in
    the order they ran (see :func:`head_site_for_map`)."""
    return [(site, k) for site, k, _ in head_sites_in(trace)]


def head_site_for_map(trace, step_index: int) -> tuple[Site, int] | None:
    """(site, output index) of the per-head output made from the attention map that step
    ``step_index`` computed (a softmax, a fused attention call, ``nn.MultiheadAttention``'s
    call, whose site is the module: :mod:`tracing.capture.heads`); None if there is none."""
    step = trace.steps[step_index]
    for rid in step.outputs:
        rec = trace.tensor(rid)
        if rec.role == "attention" and (len(rec.shape) == 4 or folded_heads(trace, rec)):
            found = head_site_of_map(trace, rec, consumers_of(trace))
            return None if found is None else found[:2]
    return None


def block_sites(trace) -> list[Site]:
    """The blocks: the module with the most children named ``0``, ``1``, ``2``... that
    all ran (``blocks`` here, ``transformer.h`` in HF GPT-2)."""
    best: list[str] = []
    ran = {s.module for s in trace.steps if s.kind == "module"}
    for path, info in trace.modules.items():
        prefix = f"{path}." if path else ""
        numbered = [c for c in info.children if c[len(prefix) :].isdigit()]
        if len(numbered) > len(best) and all(c in ran for c in numbered):
            best = sorted(numbered, key=lambda c: int(c[len(prefix) :]))
    if not best:
        raise EditError("no blocks found: the model has no list of numbered submodules")
    return [Site(path, call=0) for path in best]


# --------------------------------------------------------------------------- sweep


class _Keep(Action):
    """Keep the value in a dict under the site's name, change nothing (the clean run)."""

    def __init__(self, store: dict[str, torch.Tensor]):
        self.store = store

    def apply(self, value, ctx):
        self.store[str(ctx.site)] = value.detach().clone()
        return value


def _as_args(inputs: Any) -> tuple:
    return inputs if isinstance(inputs, tuple) else (inputs,)


def _grid(trace, over: str | Sequence, clean_values: dict, action: Action | None = None) -> tuple:
    """(rows, columns, edits per cell, (site, output, head) whose clean values are needed;
    ``head`` is every head at a head site, so that ``nn.MultiheadAttention`` keeps its
    per-head output rather than its module output). Each cell's action is a patch from
    the clean run, or ``action``."""
    source = Patch(clean_values) if action is None else action
    if isinstance(over, str) and over == "heads":
        found = head_sites_in(trace)
        if not found:
            raise EditError(
                "no attention maps with a heads axis in the trace: cannot sweep over heads"
            )
        heads = max(h for _, _, h in found)
        sites = [(site, k) for site, k, _ in found]
        rows = _head_rows(trace, [site for site, _ in sites])
        columns = [f"head {h}" for h in range(heads)]
        folded = [heads_folded_at(trace, s, k) for s, k, _ in found]
        cells = [
            [
                Edit(s, source, head=h, output=k, heads_folded=f) if h < n else None
                for h in range(heads)
            ]
            for (s, k, n), f in zip(found, folded, strict=True)
        ]
        return rows, columns, cells, [(site, k, _ALL) for site, k in sites]
    if isinstance(over, str) and over in ("layers", "positions"):
        blocks = block_sites(trace)
        rows = [str(Site(s.module)) for s in blocks]
        if over == "layers":
            cells = [[Edit(s, source)] for s in blocks]
            return rows, ["block output"], cells, [(s, 0, None) for s in blocks]
        T = trace.tensor(_site_output(trace, blocks[0], 0)).shape[-2]
        columns = [f"pos {p}" for p in range(T)]
        cells = [[Edit(s, source, positions=p) for p in range(T)] for s in blocks]
        return rows, columns, cells, [(s, 0, None) for s in blocks]
    if isinstance(over, str):
        raise ValueError(
            f"over must be 'heads', 'layers', 'positions' or a list of sites; got {over!r}"
        )
    edits = [_patch_edit(item, source) for item in over]
    rows = [e.describe().removeprefix(f"{source.describe()} at ") for e in edits]
    keep = [(e.site, e.output, None if e.head is None else _ALL) for e in edits]
    return rows, ["patched"], [[e] for e in edits], keep


_ALL = slice(None)  # every head: the clean run keeps a head site's whole per-head output


def _folded(trace, site: Site, k: int, head) -> int | None:
    """``heads_folded`` for a head edit at ``site`` (None when no head is selected)."""
    return None if head is None else heads_folded_at(trace, site, k)


def _head_rows(trace, sites: list[Site]) -> list[str]:
    """``layer i`` when there is one attention per block; the attention modules' paths
    when there are more (a decoder's self- and cross-attention) or no blocks."""
    try:
        blocks = block_sites(trace)
    except EditError:
        blocks = []
    if len(blocks) == len(sites):
        return [f"layer {i}" for i in range(len(sites))]
    return [str(Site(s.module, s.op, s.occurrence)) for s in sites]


def _patch_edit(item: Any, source: Patch) -> Edit:
    """A sweep item as a patch from the clean run: a site, or an Edit whose site, heads
    and positions are kept (its action is replaced by the patch)."""
    if isinstance(item, (str, Site)):
        return Edit(item, source)
    edit = as_edit(item)
    return Edit(
        edit.site, source, head=edit.head, positions=edit.positions, output=edit.output,
        head_axis=edit.head_axis, position_axis=edit.position_axis, on=edit.on,
        heads_folded=edit.heads_folded,
    )  # fmt: skip


def _site_output(trace, site: Site, k: int) -> int:
    from tracing.sites import site_steps

    return site_steps(trace, site)[0].outputs[k]


def sweep(
    model: nn.Module,
    clean: Any,
    corrupted: Any,
    metric: Metric | None = None,
    over: str | Sequence = "heads",
    *,
    progress: Callable[[int, int], None] | None = None,
    cancel: Callable[[], bool] | Any = None,
    token_label: Callable[[int], str] | None = None,
    action: Action | None = None,
) -> SweepResult:
    """One corrupted run per site with that site patched from the clean run; the metric of
    each run in a table (see the module doc).

    ``clean`` and ``corrupted`` are the model's input (a tensor, or a tuple of positional
    arguments) and must have the same shapes. ``metric(output) -> float`` defaults to
    :func:`logit_difference` (``token_label(id)`` names its tokens). ``progress(done,
    total)`` is called after every run; ``cancel()`` (or an object with ``is_set()``, a
    ``threading.Event``) stops the sweep between runs: the result then has
    ``cancelled=True`` and NaN where it did not run.

    ``action`` (``Zero()``, ``MeanAblate()``...) does that at each site instead of the
    patch: an ablation sweep, usually with ``corrupted`` the same input as ``clean``.
    """
    from tracing.capture.tracer import trace

    t0 = time.perf_counter()
    clean_args, corrupted_args = _as_args(clean), _as_args(corrupted)
    for a, b in zip(clean_args, corrupted_args):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape != b.shape:
            raise ValueError(
                f"clean and corrupted inputs must have the same shape to patch one into the "
                f"other; got {tuple(a.shape)} and {tuple(b.shape)}"
            )
    should_stop = getattr(cancel, "is_set", cancel)
    structure = trace(model, *clean_args, capture="shapes")
    clean_values: dict[str, torch.Tensor] = {}
    rows, columns, cells, keep = _grid(structure, over, clean_values, action)
    with torch.no_grad():
        if action is None:  # the clean values to patch from, kept in one clean run
            store: dict[str, torch.Tensor] = {}
            keeper = _Keep(store)
            keep_plan = EditPlan.of(
                [
                    Edit(s, keeper, output=k, head=h, heads_folded=_folded(structure, s, k, h))
                    for s, k, h in keep
                ]
            )
            keep_plan.check_model(model)
            clean_output = run_edited(model, *clean_args, edits=keep_plan)
            clean_values.update(store)
        else:
            clean_output = model(*clean_args)
        corrupted_output = model(*corrupted_args)
        if metric is None:
            metric, name = logit_difference(clean_output, corrupted_output, token_label)
        else:
            name = getattr(metric, "__name__", "metric")
        values = torch.full((len(rows), len(columns)), math.nan, dtype=torch.float64)
        total = sum(e is not None for r in cells for e in r)
        done = 0
        cancelled = False
        plans = [[None if e is None else EditPlan.of([e]) for e in row] for row in cells]
        for i, row in enumerate(plans):
            for j, plan in enumerate(row):
                if plan is None:  # a layer with fewer heads than the widest
                    continue
                if should_stop is not None and should_stop():
                    cancelled = True
                    break
                values[i, j] = metric(run_edited(model, *corrupted_args, edits=plan))
                done += 1
                if progress is not None:
                    progress(done, total)
            if cancelled:
                break
        result = SweepResult(
            over=over if isinstance(over, str) else "sites",
            rows=rows,
            columns=columns,
            values=values,
            edits=cells,
            clean_metric=metric(clean_output),
            corrupted_metric=metric(corrupted_output),
            metric_name=name,
            cancelled=cancelled,
            runs=done,
        )
    result.seconds = time.perf_counter() - t0
    return result


__all__ = [
    "SweepResult",
    "block_sites",
    "head_site_for_map",
    "head_sites",
    "logit_difference",
    "output_logits",
    "sweep",
]
