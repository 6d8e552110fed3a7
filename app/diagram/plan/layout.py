"""Where the diagram's boxes go: visible nodes, data-flow edges, a layered layout.

:class:`DiagramLayout` decides *what* is drawn and *where*, in plain Python. Given a
``Trace`` and the set of expanded module calls it finds the visible boxes (a collapsed
module call stands for everything inside it), the data-flow edges between them (producer ->
consumer by tensor id, the residual paths included), and a layered layout: each expanded
module is a frame whose children are placed in rows by topological generation
(``networkx.topological_generations``), top to bottom, recursively.

No Qt here: positions are :class:`~app.diagram.plan.geometry.Rect` s, and text is measured by the
:class:`~app.diagram.plan.geometry.TextMeasure` passed in (the view makes one from its fonts,
tests a fixed-width one), so a layout can be computed and checked without a QApplication.

Box keys are step indices: a box is one module call or one op, so a module called twice is
two boxes. Two synthetic boxes, :data:`INPUT` and :data:`OUTPUT`, stand for the model's
inputs and outputs.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import networkx as nx

from app import theme
from app.diagram.plan.folding import MODEL_INPUT, Run, TraceIndex
from app.diagram.plan.geometry import Point, Rect, TextMeasure, bounding
from tracing.dim_legend import dims_hover, dims_text, letter_legend
from tracing.formatting import format_shape, step_number, step_text

if TYPE_CHECKING:  # pragma: no cover
    from tracing import Step, Trace

INPUT = -1
OUTPUT = -2

# --------------------------------------------------------------------------- geometry

MODULE_MIN_W = 150.0
OP_MIN_W = 104.0
H_PAD = 12.0  # text padding inside a box
H_GAP = 26.0  # between boxes in a row
V_GAP = 34.0  # between rows (room for arrows)
FRAME_PAD = 16.0
FRAME_TITLE = 32.0
LANE_GAP = 22.0  # distance of a detouring edge from the boxes it avoids
ARROW = 8.0
SPARK_H = 14.0  # room for a folded run's sparkline


def display_name(path: str) -> str:
    """``blocks.3`` for a numbered child (``3`` alone says nothing), else the last part."""
    if not path:
        return "model"
    parts = path.split(".")
    if parts[-1].isdigit() and len(parts) > 1:
        return f"{parts[-2]}.{parts[-1]}"
    return parts[-1]


def shape_label(trace: Trace, tensor_id: int) -> str:
    """``(B, KV, H/KV, T, D)``, whole: the dims where known (``?=32`` for an axis no
    evidence names), else the sizes ``(3, 11, 32)``."""
    record = trace.tensors[tensor_id]
    if record.dims and len(record.dims) == len(record.shape):
        return dims_text(record.shape, record.dims)
    return format_shape(record.shape)


# --------------------------------------------------------------------------- layout

#: a group (a frame's content, or the top level) shows at most this many boxes; longer ones
#: are paged into range boxes ("steps 1–4,000"), so nothing lays out 50,000 boxes at once
MAX_ITEMS = 48
#: pages a long group or an opened run is cut into
PAGES = 12
#: repetitions around the current step shown as their own boxes when a run is split
WINDOW = 4
#: first key of a fold box (folds get -3, -4, ... in the order they are laid out)
FOLD_BASE = -3


@dataclass
class Node:
    """One drawn thing: a box (a collapsed module call, an op, input/output, a folded run)
    or a frame (an expanded module call, an opened run)."""

    key: int  # step index, INPUT / OUTPUT, or a fold key (<= FOLD_BASE)
    frame: bool  # an expanded module call drawn around its children
    title: str
    subtitle: str  # module type ("" for ops)
    shape: str  # output shape label
    accent: str  # colour of the stripe (theme.accent_for)
    expandable: bool = False
    error: bool = False
    parent: int | None = None  # key of the enclosing frame (None at the top level)
    children: list[int] = field(default_factory=list)
    rect: Rect = field(default_factory=Rect)  # scene coordinates once laid out
    tooltip: str = ""
    step: int | None = None  # the step a click goes to (a fold: its first step)
    spark: tuple[float, ...] = ()  # a fold: output RMS per repetition (sampled)
    count: int = 0  # a fold: its repetitions


class DiagramLayout:
    """Visible boxes, edges and positions for one trace and one set of expanded calls.

    ``open_folds`` holds the :class:`~app.diagram.plan.folding.Run` s the user opened; ``focus``
    is the current step: a folded run holding it is split so that the repetition holding
    the step shows as its own box(es) between a fold before and a fold after. ``fold``
    False turns repetition folding off (long groups are still paged).
    """

    def __init__(
        self,
        trace: Trace,
        expanded: Iterable[int],
        measure: TextMeasure,
        *,
        index: TraceIndex | None = None,
        open_folds: Iterable[Run] = (),
        focus: int | None = None,
        fold: bool = True,
    ):
        self.trace = trace
        self.index = index if index is not None else TraceIndex(trace)
        self.measure = measure
        self.legend = letter_legend(trace.meta)  # the letters a box's tooltip explains

        steps = trace.steps
        idx = self.index
        self.expanded = {i for i in expanded if 0 <= i < len(steps) and idx.has_children(i)}
        self.open_folds = set(open_folds)
        self.fold_enabled = fold
        self.focus = focus if focus is not None and 0 <= focus < len(steps) else None
        if self.focus is not None and steps[self.focus].kind == "backward":
            self.focus = steps[self.focus].forward  # shown on its forward step's box
        self._focus_chain = self._chain_of_step(self.focus)

        self.nodes: dict[int, Node] = {}
        self.folds: dict[int, Run] = {}  # fold key -> the run it stands for
        self._leaves: list[tuple[int, int, int]] = []  # (first step, last step, key)
        self._place_group(None, 0, len(idx.children(None)), None)
        for key, node in self.nodes.items():
            if node.parent is not None and node.parent in self.nodes:
                self.nodes[node.parent].children.append(key)
        self._leaves.sort()
        self._leaf_starts = [first for first, _, _ in self._leaves]

        self._add_io_nodes()
        self.edges = self._edges()
        self._layout()

    # ---- which boxes

    def _chain_of_step(self, index: int | None) -> dict[int | None, int]:
        """parent -> the ancestor-or-self of step ``index`` directly under that parent."""
        chain: dict[int | None, int] = {}
        steps = self.trace.steps
        while index is not None:
            chain[steps[index].parent] = index
            index = steps[index].parent
        return chain

    def _focus_position(self, parent: int | None) -> int | None:
        child = self._focus_chain.get(parent)
        return None if child is None else self.index.position[child]

    def _place_group(self, parent: int | None, lo: int, hi: int, frame: int | None) -> None:
        """Boxes for ``parent``'s children at positions ``[lo, hi)`` inside ``frame``."""
        focus = self._focus_position(parent)
        units: list[int | Run] = []  # a child position, or a run of them
        pos = lo
        runs = self.index.runs_within(parent, lo, hi) if self.fold_enabled else []
        for run in runs:
            units.extend(range(pos, run.start))
            units.extend(self._split(run, focus))
            pos = run.stop
        units.extend(range(pos, hi))
        if len(units) > MAX_ITEMS:
            units = self._paged(parent, units, focus)
        for unit in units:
            self._place_unit(parent, unit, frame)

    def _split(self, run: Run, focus: int | None) -> list[int | Run]:
        """A run as one fold, or, when it holds the focus, fold · a few repetitions · fold."""
        if run in self.open_folds or focus is None or not run.start <= focus < run.stop:
            return [run]
        k = run.member_of(focus)
        first = (k // WINDOW) * WINDOW
        last = min(run.count, first + WINDOW)
        out: list[int | Run] = []
        out.extend(self._part(run, 0, first))
        out.extend(range(run.member_span(first)[0], run.member_span(last - 1)[1]))
        out.extend(self._part(run, last, run.count))
        return out

    @staticmethod
    def _part(run: Run, first: int, last: int) -> list[int | Run]:
        """Repetitions ``[first, last)`` of ``run``: a fold when there are several."""
        if last <= first:
            return []
        start, stop = run.member_span(first)[0], run.member_span(last - 1)[1]
        if last - first >= 2:
            return [Run(run.parent, start, stop, run.period)]
        return list(range(start, stop))

    def _paged(self, parent: int | None, units: list[int | Run], focus: int | None):
        """A long list of boxes cut into :data:`PAGES` range boxes; the focus page opened."""
        size = -(-len(units) // PAGES)
        out: list[int | Run] = []
        for k in range(0, len(units), size):
            page = units[k : k + size]
            start = page[0] if isinstance(page[0], int) else page[0].start
            stop = page[-1] + 1 if isinstance(page[-1], int) else page[-1].stop
            if len(page) == 1:
                out.extend(page)
                continue
            rng = Run(parent, start, stop, 0)
            if rng in self.open_folds or focus is None or not start <= focus < stop:
                out.append(rng)
                continue
            # the page holding the current step: a window of its boxes, ranges around it
            at = next(
                j for j, u in enumerate(page)
                if (u == focus if isinstance(u, int) else u.start <= focus < u.stop)
            )  # fmt: skip
            first = (at // WINDOW) * WINDOW
            out.extend(self._range_of(parent, page[:first]))
            out.extend(page[first : first + WINDOW])
            out.extend(self._range_of(parent, page[first + WINDOW :]))
        return out

    @staticmethod
    def _range_of(parent: int | None, units: list[int | Run]) -> list[int | Run]:
        if len(units) < 2:
            return list(units)
        start = units[0] if isinstance(units[0], int) else units[0].start
        stop = units[-1] + 1 if isinstance(units[-1], int) else units[-1].stop
        return [Run(parent, start, stop, 0)]

    def _place_unit(self, parent: int | None, unit: int | Run, frame: int | None) -> None:
        idx = self.index
        if isinstance(unit, Run):
            key = FOLD_BASE - len(self.folds)
            self.folds[key] = unit
            opened = unit in self.open_folds
            self.nodes[key] = self._fold_node(key, unit, frame, opened)
            if not opened:
                first, last = idx.span_steps(unit.parent, unit.start, unit.stop)
                self._leaves.append((first, last, key))
            elif unit.period:
                self._place_run_members(unit, key)
            else:
                self._place_group(unit.parent, unit.start, unit.stop, key)
            return
        step = idx.children(parent)[unit]
        s = self.trace.steps[step]
        is_frame = step in self.expanded
        self.nodes[step] = self._node_for(s, frame, is_frame)
        if is_frame:
            self._place_group(step, 0, len(idx.children(step)), step)
        else:
            self._leaves.append((step, idx.last[step], step))

    def _place_run_members(self, run: Run, key: int) -> None:
        """An opened run: its repetitions, or pages of them (smaller runs) when many."""
        if run.count * run.period <= MAX_ITEMS:
            units: list[int | Run] = list(range(run.start, run.stop))
        else:
            per = -(-run.count // PAGES)
            focus = self._focus_position(run.parent)
            units = []
            for k in range(0, run.count, per):
                for part in self._part(run, k, min(run.count, k + per)):
                    units.extend(self._split(part, focus) if isinstance(part, Run) else [part])
        for unit in units:
            self._place_unit(run.parent, unit, key)

    # ---- nodes

    def _node_for(self, s: Step, frame: int | None, is_frame: bool) -> Node:
        trace = self.trace
        shape = shape_label(trace, s.outputs[0]) if s.outputs else ""
        if len(s.outputs) > 1:
            shape += f" +{len(s.outputs) - 1}"
        if s.kind == "module":
            title = display_name(s.module)
            if s.call:
                title += f" (call {s.call + 1})"
            subtitle = s.op
            accent = theme.accent_for(s.op)
        else:
            title, subtitle, accent = s.op, "", theme.accent_for(s.op)
        tip = [f"<b>{s.module or '<root>'}</b> · {s.op}", step_text(s.index)]
        for name, tid in zip(s.output_names or ("output",) * len(s.outputs), s.outputs):
            rec = trace.tensors[tid]
            tip.append(f"{name}: {rec.shape_str()} {rec.dtype}")
        if s.outputs:  # what the first output's letters are: size, meaning, origin
            rec = trace.tensors[s.outputs[0]]
            if rec.dims:
                hover = dims_hover(rec.shape, rec.dims, self.legend, rec.why).split("\n")[1:]
                tip.append("<small>" + "<br>".join(_html(x) for x in hover) + "</small>")
        if s.source is not None and s.source.text:
            tip.append(f"<code>{_html(s.source.text)}</code>")
        if s.error:
            tip.append(f"<span style='color:{theme.ERROR}'>{_html(s.error)}</span>")
        return Node(
            key=s.index,
            frame=is_frame,
            title=title,
            subtitle=subtitle,
            shape=shape,
            accent=accent,
            expandable=self.index.has_children(s.index),
            error=s.error is not None,
            parent=frame,
            tooltip="<br>".join(tip),
            step=s.index,
        )

    def _fold_node(self, key: int, run: Run, frame: int | None, opened: bool) -> Node:
        trace, idx = self.trace, self.index
        kids = idx.children(run.parent)
        first_step, last_step = idx.span_steps(run.parent, run.start, run.stop)
        head = trace.steps[kids[run.start]]
        tail = trace.steps[kids[run.stop - 1]]
        if run.period == 0:
            title = f"steps {step_number(first_step):,}–{step_number(last_step):,}"
            subtitle = f"{run.count:,} boxes · {last_step - first_step + 1:,} steps"
            accent = theme.accent_for("range")
        elif run.period == 1:
            subtitle = head.op if head.kind == "module" else "op"
            if head.kind == "module" and head.module != tail.module:
                title = f"{display_name(head.module)}–{tail.module.rsplit('.', 1)[-1]}"
                subtitle += f" × {run.count:,}"
            else:
                title = f"{display_name(head.module) if head.kind == 'module' else head.op}"
                title += f" × {run.count:,}"
                if head.kind == "module":
                    subtitle += f" · calls {head.call + 1:,}–{tail.call + 1:,}"
            accent = theme.accent_for(head.op)
        else:
            pattern = [trace.steps[kids[run.start + j]] for j in range(run.period)]
            names = [display_name(s.module) if s.kind == "module" else s.op for s in pattern]
            title = f"[{' → '.join(names)}] × {run.count:,}"
            subtitle = f"{run.period} steps repeated"
            accent = theme.accent_for(pattern[-1].op)
        shape = shape_label(trace, tail.outputs[0]) if tail.outputs else ""
        spark = self._sparkline(run)
        tip = [
            f"<b>{_html(title)}</b>",
            f"steps {step_number(first_step):,}–{step_number(last_step):,}",
            "double-click to open" if not opened else "double-click the title to fold",
        ]
        if spark:
            tip.append("sparkline: output RMS of each repetition")
        error = any(trace.steps[i].error for i in (first_step, last_step))
        return Node(
            key=key,
            frame=opened,
            title=title,
            subtitle=subtitle,
            shape=shape,
            accent=accent,
            expandable=True,
            error=error,
            parent=frame,
            tooltip="<br>".join(tip),
            step=first_step,
            spark=spark,
            count=run.count,
        )

    def _sparkline(self, run: Run, samples: int = 48) -> tuple[float, ...]:
        """Output RMS of (up to ``samples``) repetitions, where statistics were kept."""
        if run.period == 0:
            return ()
        trace, kids = self.trace, self.index.children(run.parent)
        n = run.count
        if n <= samples:
            picks: Iterable[int] = range(n)
        else:
            picks = (round(k * (n - 1) / (samples - 1)) for k in range(samples))
        out = []
        for k in picks:
            step = trace.steps[kids[run.member_span(k)[1] - 1]]
            if not step.outputs:
                return ()
            stats = trace.tensors[step.outputs[0]].stats
            if stats is None:
                return ()
            out.append(math.sqrt(stats.mean**2 + stats.std**2))
        return tuple(out) if all(math.isfinite(v) for v in out) else ()

    def frame_title(self, key: int) -> str:
        run = self.folds.get(key)
        if run is not None:
            node = self.nodes[key]
            return f"{node.title}  ·  {node.subtitle}"
        step = self.trace.steps[key]
        return f"{step.module or 'model'}  ·  {step.op}"

    def _frame_title(self, node: Node) -> str:
        return self.frame_title(node.key)

    def owner_of(self, index: int) -> int | None:
        """The visible box (or frame) standing for step ``index``.

        A backward step is drawn as the box of the forward step it differentiates.
        """
        step = self.trace.steps[index]
        if step.kind == "backward":
            if step.forward is None:
                return self._leaves[0][2] if self._leaves else None
            index = step.forward
        k = bisect_right(self._leaf_starts, index) - 1
        if k >= 0:
            first, last, key = self._leaves[k]
            if first <= index <= last:
                return key
        steps = self.trace.steps
        while index is not None and index not in self.nodes:
            index = steps[index].parent
        return index

    def needs_focus(self, index: int) -> bool:
        """Whether showing step ``index`` means opening a fold (a new layout)."""
        return (self.owner_of(index) or 0) <= FOLD_BASE

    def _add_io_nodes(self) -> None:
        trace, idx = self.trace, self.index
        self.root_inputs = idx.root_inputs
        first_inputs: list[str] = []
        for i in idx.children(None):
            s = trace.steps[i]
            for name, tid in zip(s.input_names or ("input",) * len(s.inputs), s.inputs):
                if tid in self.root_inputs:
                    first_inputs.append(f"{name}: {shape_label(trace, tid)}")
        if self.root_inputs:
            tid = min(self.root_inputs)
            self.nodes[INPUT] = Node(
                INPUT, False, "input", "", shape_label(trace, tid), theme.IO_ACCENT,
                tooltip="<br>".join(first_inputs),
            )  # fmt: skip
        self.root_outputs = [tid for i in idx.children(None) for tid in trace.steps[i].outputs]
        if self.root_outputs and trace.error is None:
            self.nodes[OUTPUT] = Node(
                OUTPUT, False, "output", "", shape_label(trace, self.root_outputs[0]),
                theme.IO_ACCENT, tooltip="what the model returned",
            )  # fmt: skip

    # ---- edges

    def _edges(self) -> list[tuple[int, int]]:
        """Data-flow edges between visible boxes (see :meth:`TraceIndex.source_of`)."""
        idx, nodes = self.index, self.nodes
        seen: set[tuple[int, int]] = set()
        edges: list[tuple[int, int]] = []

        def add(src: int, target: int) -> None:
            u = INPUT if src == MODEL_INPUT else self.owner_of(src)
            if u is None or u == target or (u, target) in seen or u not in nodes:
                return
            if self.is_ancestor(u, target) or self.is_ancestor(target, u):
                return
            seen.add((u, target))
            edges.append((u, target))

        for _, _, key in self._leaves:
            run = self.folds.get(key)
            if run is not None:
                sources = idx.fold_sources(run.parent, run.start, run.stop)
            elif self.trace.steps[key].kind == "module":
                sources = idx.external(key)
            else:
                sources = idx.sources(key)
            for src in sorted(sources):
                add(src, key)
        if OUTPUT in nodes:
            for tid in self.root_outputs:
                src = idx.source_of(tid, len(self.trace.steps))
                if src is not None and src != MODEL_INPUT:
                    add(src, OUTPUT)
        return edges

    def is_ancestor(self, a: int, b: int) -> bool:
        """Whether frame ``a`` encloses node ``b``."""
        if a in (INPUT, OUTPUT) or b in (INPUT, OUTPUT):
            return False
        node = self.nodes.get(b)
        while node is not None and node.parent is not None:
            if node.parent == a:
                return True
            node = self.nodes.get(node.parent)
        return False

    def _chain(self, key: int) -> list[int]:
        """``[key, its frame, that frame's frame, ...]``."""
        chain = [key]
        node = self.nodes[key]
        while node.parent is not None:
            chain.append(node.parent)
            node = self.nodes[node.parent]
        return chain

    # ---- placement

    def _box_size(self, node: Node) -> tuple[float, float]:
        """A box's (width, height): its widest line of text, whole pixels."""
        title_width, detail_width = self.measure.title_width, self.measure.detail_width
        widths = [title_width(node.title), detail_width(node.shape)]
        if node.subtitle:
            widths.append(detail_width(node.subtitle))
        is_op = not node.subtitle
        lines = 2 if is_op else 3
        badge = 22 if node.expandable else 0  # room for the "+" in the corner
        w = max(OP_MIN_W if is_op else MODULE_MIN_W, max(widths) + 2 * H_PAD + 8 + badge)
        spark = SPARK_H if node.spark else 0
        h = lines * self.measure.line_height + (10 if is_op else 14) + spark
        return float(int(w + 0.5)), float(int(h + 0.5))

    def _layout(self) -> None:
        groups: dict[int | None, list[int]] = {}
        for key, node in self.nodes.items():
            groups.setdefault(node.parent, []).append(key)
        # each edge belongs to the innermost group holding both ends
        group_edges: dict[int | None, set[tuple[int, int]]] = {}
        for u, v in self.edges:
            cu, cv = self._chain(u), self._chain(v)
            shared = set(cu) & set(cv)
            # walk up u's chain until its parent is a frame that also encloses v
            for a in cu:
                parent = self.nodes[a].parent
                if parent is None or parent in shared:
                    b = next((x for x in cv if self.nodes[x].parent == parent), None)
                    if b is not None and a != b and self._order(a) < self._order(b):
                        group_edges.setdefault(parent, set()).add((a, b))
                    break
        self._sizes: dict[int, tuple[float, float]] = {}
        self._local: dict[int, Point] = {}
        self._measure(None, groups, group_edges)
        self._place(None, Point(0.0, 0.0), groups)

    def _order(self, key: int) -> float:
        """Execution order of a node; the input box first and the output box last."""
        if key == INPUT:
            return -1.0
        if key == OUTPUT:
            return float("inf")
        if key <= FOLD_BASE:
            return float(self.nodes[key].step or 0)
        return float(key)

    def _measure(self, group, groups, group_edges) -> tuple[float, float]:
        """Lay out ``group``'s children in rows; return the content's (width, height)."""
        items = sorted(groups.get(group, []), key=self._order)
        for key in items:
            node = self.nodes[key]
            if node.frame:
                cw, ch = self._measure(key, groups, group_edges)
                title_w = self.measure.title_width(self._frame_title(node)) + 40
                self._sizes[key] = (max(cw, title_w) + 2 * FRAME_PAD, ch + FRAME_TITLE + FRAME_PAD)
            else:
                self._sizes[key] = self._box_size(node)
        graph = nx.DiGraph()
        graph.add_nodes_from(items)
        graph.add_edges_from(group_edges.get(group, ()))
        rows = [sorted(gen, key=self._order) for gen in nx.topological_generations(graph)]
        # keep the output box alone on the last row
        if group is None and OUTPUT in graph and len(rows) > 1:
            for row in rows:
                if OUTPUT in row:
                    row.remove(OUTPUT)
            rows = [r for r in rows if r] + [[OUTPUT]]
        widths = [sum(self._sizes[k][0] for k in row) + H_GAP * (len(row) - 1) for row in rows]
        content_w = max(widths, default=0.0)
        y = 0.0
        for row, row_w in zip(rows, widths):
            x = (content_w - row_w) / 2
            row_h = max(self._sizes[k][1] for k in row)
            for k in row:
                w, h = self._sizes[k]
                self._local[k] = Point(x, y + (row_h - h) / 2)
                x += w + H_GAP
            y += row_h + V_GAP
        return content_w, max(0.0, y - V_GAP)

    def _place(self, group, origin: Point, groups) -> None:
        for key in groups.get(group, []):
            w, h = self._sizes[key]
            pos = origin + self._local[key]
            node = self.nodes[key]
            node.rect = Rect(pos.x, pos.y, w, h)
            if node.frame:
                self._place(key, pos + Point(FRAME_PAD, FRAME_TITLE), groups)
        # centre a frame's content when its title made it wider than the content
        if group is not None:
            frame = self.nodes[group]
            kids = [self.nodes[k].rect for k in groups.get(group, [])]
            if kids:
                left = min(r.left for r in kids)
                right = max(r.right for r in kids)
                shift = (frame.rect.left + frame.rect.right) / 2 - (left + right) / 2
                if abs(shift) > 0.5:
                    self._shift(group, shift, groups)

    def _shift(self, group, dx: float, groups) -> None:
        for key in groups.get(group, []):
            node = self.nodes[key]
            node.rect = node.rect.moved(dx, 0.0)
            if node.frame:
                self._shift(key, dx, groups)

    def bounding_rect(self) -> Rect:
        """The rectangle holding every box and frame."""
        return bounding(node.rect for node in self.nodes.values())


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
