"""Where the diagram's boxes go: visible nodes, data-flow edges, a layered layout.

:class:`DiagramLayout` decides *what* is drawn and *where*. Given a ``Trace`` and the set of
expanded module calls it finds the visible boxes (a collapsed module call stands for
everything inside it), the data-flow edges between them (producer -> consumer by tensor id,
the residual paths included), and a layered layout: each expanded module is a frame whose
children are placed in rows by topological generation (``networkx.topological_generations``),
top to bottom, recursively.

Box keys are step indices: a box is one module call or one op, so a module called twice is
two boxes. Two synthetic boxes, :data:`INPUT` and :data:`OUTPUT`, stand for the model's
inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import networkx as nx
from PySide6.QtCore import QPointF, QRectF, QSize
from PySide6.QtGui import QFont, QFontMetricsF

from app import theme
from tracing.formatting import dims_label

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


def display_name(path: str) -> str:
    """``blocks.3`` for a numbered child (``3`` alone says nothing), else the last part."""
    if not path:
        return "model"
    parts = path.split(".")
    if parts[-1].isdigit() and len(parts) > 1:
        return f"{parts[-2]}.{parts[-1]}"
    return parts[-1]


def shape_label(trace: Trace, tensor_id: int) -> str:
    """``(B, T, C)`` with symbolic dims where known, the size where an axis is unknown."""
    record = trace.tensors[tensor_id]
    return dims_label(record.shape, record.dims)


# --------------------------------------------------------------------------- layout


@dataclass
class Node:
    """One drawn thing: a box (a collapsed module call, an op, input/output) or a frame."""

    key: int  # step index, or INPUT / OUTPUT
    frame: bool  # an expanded module call drawn around its children
    title: str
    subtitle: str  # module type ("" for ops)
    shape: str  # output shape label
    accent: str  # colour of the stripe (theme.accent_for)
    expandable: bool = False
    error: bool = False
    parent: int | None = None  # key of the enclosing frame (None at the top level)
    children: list[int] = field(default_factory=list)
    rect: QRectF = field(default_factory=QRectF)  # scene coordinates once laid out
    tooltip: str = ""


class DiagramLayout:
    """Visible boxes, edges and positions for one trace and one set of expanded calls."""

    def __init__(self, trace: Trace, expanded: Iterable[int], font: QFont):
        self.trace = trace
        self.font = font
        self.bold = QFont(font)
        self.bold.setBold(True)
        self.small = QFont(font)
        self.small.setPointSizeF(max(6.0, font.pointSizeF() * 0.88))
        self._fm = QFontMetricsF(font)
        self._fm_bold = QFontMetricsF(self.bold)
        self._fm_small = QFontMetricsF(self.small)
        self.line_h = max(self._fm.height(), self._fm_bold.height())

        steps = trace.steps
        has_children = _steps_with_children(trace)
        self.expanded = {i for i in expanded if 0 <= i < len(steps) and i in has_children}

        # owner[i]: the visible node standing for step i (itself, or a collapsed ancestor)
        owner = [0] * len(steps)
        for s in steps:
            p = s.parent
            if s.kind == "backward":  # drawn as the box of the forward step it differentiates
                owner[s.index] = owner[s.forward] if s.forward is not None else 0
            elif p is None or (p in self.expanded and owner[p] == p):
                owner[s.index] = s.index
            else:
                owner[s.index] = owner[p]
        self.owner = owner

        self.nodes: dict[int, Node] = {}
        for s in steps:
            if owner[s.index] == s.index:
                self.nodes[s.index] = self._node_for(s, has_children)
        for key, node in self.nodes.items():
            if node.parent is not None and node.parent in self.nodes:
                self.nodes[node.parent].children.append(key)

        top = [s.index for s in steps if s.parent is None and s.kind != "backward"]
        self._add_io_nodes(top)
        self.edges = self._edges(top)
        self._layout()

    # ---- nodes

    def _node_for(self, s: Step, has_children: set[int]) -> Node:
        trace = self.trace
        frame = s.index in self.expanded
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
        tip = [f"<b>{s.module or '<root>'}</b> · {s.op}", f"step {s.index + 1}"]
        for name, tid in zip(s.output_names or ("output",) * len(s.outputs), s.outputs):
            rec = trace.tensors[tid]
            tip.append(f"{name}: {rec.shape_str()} {rec.dtype}")
        if s.source is not None and s.source.text:
            tip.append(f"<code>{_html(s.source.text)}</code>")
        if s.error:
            tip.append(f"<span style='color:{theme.ERROR}'>{_html(s.error)}</span>")
        return Node(
            key=s.index,
            frame=frame,
            title=title,
            subtitle=subtitle,
            shape=shape,
            accent=accent,
            expandable=s.index in has_children,
            error=s.error is not None,
            parent=s.parent if s.parent is not None and s.parent in self.expanded else None,
            tooltip="<br>".join(tip),
        )

    def _add_io_nodes(self, top: list[int]) -> None:
        trace = self.trace
        self.root_inputs: set[int] = set()
        first_inputs: list[str] = []
        for i in top:
            s = trace.steps[i]
            for name, tid in zip(s.input_names or ("input",) * len(s.inputs), s.inputs):
                if trace.tensors[tid].producer is None and trace.tensors[tid].role != "param":
                    self.root_inputs.add(tid)
                    first_inputs.append(f"{name}: {shape_label(trace, tid)}")
        if self.root_inputs:
            tid = min(self.root_inputs)
            self.nodes[INPUT] = Node(
                INPUT, False, "input", "", shape_label(trace, tid), theme.IO_ACCENT,
                tooltip="<br>".join(first_inputs),
            )  # fmt: skip
        self.root_outputs = [tid for i in top for tid in trace.steps[i].outputs]
        if self.root_outputs and trace.error is None:
            self.nodes[OUTPUT] = Node(
                OUTPUT, False, "output", "", shape_label(trace, self.root_outputs[0]),
                theme.IO_ACCENT, tooltip="what the model returned",
            )  # fmt: skip

    # ---- edges

    def _edges(self, top: list[int]) -> list[tuple[int, int]]:
        """Data-flow edges between visible nodes.

        A tensor comes from the *last* step that handed it on before the consumer ran, not
        only from the op that created it: a dropout in eval mode returns its input
        unchanged, and the next block should hang below the dropout, not beside it. A
        module call counts as handing a tensor on once it has returned.
        """
        trace, owner, nodes = self.trace, self.owner, self.nodes
        seen: set[tuple[int, int]] = set()
        edges: list[tuple[int, int]] = []
        handed_on: dict[int, list[Step]] = {}
        for st in trace.steps:
            for tid in st.outputs:
                handed_on.setdefault(tid, []).append(st)

        def source_of(tid: int, consumer: int) -> int | None:
            for st in reversed(handed_on.get(tid, ())):
                if st.kind == "module":
                    if st.end is not None and st.end < consumer and st.parent is not None:
                        return st.index
                elif st.index < consumer:
                    return st.index
            return trace.tensors[tid].producer

        def add(u: int, v: int) -> None:
            if u == v or (u, v) in seen or u not in nodes or v not in nodes:
                return
            if self.is_ancestor(u, v) or self.is_ancestor(v, u):
                return
            seen.add((u, v))
            edges.append((u, v))

        for st in trace.steps:
            target = owner[st.index]
            if nodes[target].frame:  # an expanded call: its children carry the edges
                continue
            for tid in st.inputs:
                producer = source_of(tid, st.index)
                if producer is None:
                    if tid in self.root_inputs:
                        add(INPUT, target)
                    continue
                if 0 <= producer < len(owner):
                    add(owner[producer], target)
        if OUTPUT in nodes:
            for tid in self.root_outputs:
                producer = source_of(tid, len(trace.steps))
                if producer is not None and 0 <= producer < len(owner):
                    add(owner[producer], OUTPUT)
        return edges

    def is_ancestor(self, a: int, b: int) -> bool:
        """Whether frame ``a`` encloses node ``b``."""
        if a < 0 or b < 0:
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

    def _box_size(self, node: Node) -> QSize:
        fb, fs = self._fm_bold, self._fm_small
        widths = [fb.horizontalAdvance(node.title), fs.horizontalAdvance(node.shape)]
        if node.subtitle:
            widths.append(fs.horizontalAdvance(node.subtitle))
        is_op = not node.subtitle
        lines = 2 if is_op else 3
        badge = 22 if node.expandable else 0  # room for the "+" in the corner
        w = max(OP_MIN_W if is_op else MODULE_MIN_W, max(widths) + 2 * H_PAD + 8 + badge)
        h = lines * self.line_h + (10 if is_op else 14)
        return QSize(int(w + 0.5), int(h + 0.5))

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
                    if b is not None and a != b and _order(a) < _order(b):
                        group_edges.setdefault(parent, set()).add((a, b))
                    break
        self._sizes: dict[int, tuple[float, float]] = {}
        self._local: dict[int, QPointF] = {}
        self._measure(None, groups, group_edges)
        self._place(None, QPointF(0, 0), groups)

    def _measure(self, group, groups, group_edges) -> tuple[float, float]:
        """Lay out ``group``'s children in rows; return the content's (width, height)."""
        items = sorted(groups.get(group, []), key=_order)
        for key in items:
            node = self.nodes[key]
            if node.frame:
                cw, ch = self._measure(key, groups, group_edges)
                title_w = self._fm_bold.horizontalAdvance(self._frame_title(node)) + 40
                self._sizes[key] = (max(cw, title_w) + 2 * FRAME_PAD, ch + FRAME_TITLE + FRAME_PAD)
            else:
                size = self._box_size(node)
                self._sizes[key] = (float(size.width()), float(size.height()))
        graph = nx.DiGraph()
        graph.add_nodes_from(items)
        graph.add_edges_from(group_edges.get(group, ()))
        rows = [sorted(gen, key=_order) for gen in nx.topological_generations(graph)]
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
                self._local[k] = QPointF(x, y + (row_h - h) / 2)
                x += w + H_GAP
            y += row_h + V_GAP
        return content_w, max(0.0, y - V_GAP)

    def _place(self, group, origin: QPointF, groups) -> None:
        for key in groups.get(group, []):
            w, h = self._sizes[key]
            pos = origin + self._local[key]
            node = self.nodes[key]
            node.rect = QRectF(pos.x(), pos.y(), w, h)
            if node.frame:
                self._place(key, pos + QPointF(FRAME_PAD, FRAME_TITLE), groups)
        # centre a frame's content when its title made it wider than the content
        if group is not None:
            frame = self.nodes[group]
            kids = [self.nodes[k].rect for k in groups.get(group, [])]
            if kids:
                left = min(r.left() for r in kids)
                right = max(r.right() for r in kids)
                shift = (frame.rect.left() + frame.rect.right()) / 2 - (left + right) / 2
                if abs(shift) > 0.5:
                    self._shift(group, shift, groups)

    def _shift(self, group, dx: float, groups) -> None:
        for key in groups.get(group, []):
            self.nodes[key].rect.translate(dx, 0)
            if self.nodes[key].frame:
                self._shift(key, dx, groups)

    def _frame_title(self, node: Node) -> str:
        step = self.trace.steps[node.key]
        return f"{step.module or 'model'}  ·  {step.op}"

    def frame_title(self, key: int) -> str:
        return self._frame_title(self.nodes[key])

    def bounding_rect(self) -> QRectF:
        rect = QRectF()
        for node in self.nodes.values():
            rect = rect.united(node.rect)
        return rect


def _order(key: int) -> float:
    """Execution order of a node; the input box first and the output box last."""
    if key == INPUT:
        return -1.0
    if key == OUTPUT:
        return float("inf")
    return float(key)


def _steps_with_children(trace: Trace) -> set[int]:
    return {s.parent for s in trace.steps if s.parent is not None}


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
