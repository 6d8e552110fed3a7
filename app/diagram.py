"""The block diagram: modules as boxes, data flow as arrows, the current step highlighted.

Two halves, kept apart:

- :class:`DiagramLayout` (plain Python) decides *what* is drawn and *where*. Given a
  ``Trace`` and the set of expanded module calls it finds the visible boxes (a collapsed
  module call stands for everything inside it), the data-flow edges between them (producer
  -> consumer by tensor id, the residual paths included), and a layered layout: each
  expanded module is a frame whose children are placed in rows by topological generation
  (``networkx.topological_generations``), top to bottom, recursively.
- :class:`DiagramView` (Qt) draws it in a ``QGraphicsScene`` with :class:`BoxItem`,
  :class:`FrameItem` and :class:`EdgeItem`, and handles clicks, double-clicks (expand /
  collapse), wheel zoom, drag pan and fit-to-window.

Box keys are step indices: a box is one module call or one op, so a module called twice is
two boxes. Two synthetic boxes, :data:`INPUT` and :data:`OUTPUT`, stand for the model's
inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import networkx as nx
from PySide6.QtCore import QPointF, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import (
    QBrush,
    QColor,
    QFont,
    QFontMetricsF,
    QImage,
    QPainter,
    QPainterPath,
    QPainterPathStroker,
    QPen,
    QPolygonF,
)
from PySide6.QtWidgets import (
    QGraphicsItem,
    QGraphicsScene,
    QGraphicsView,
    QStyleOptionGraphicsItem,
    QWidget,
)

if TYPE_CHECKING:  # pragma: no cover
    from tracing import Step, Trace

INPUT = -1
OUTPUT = -2

# --------------------------------------------------------------------------- look

BACKGROUND = QColor("#1b1d23")
BOX_FILL = QColor("#262a33")
BOX_BORDER = QColor("#3a404d")
TEXT = QColor("#e6e9ef")
TEXT_MUTED = QColor("#9aa3b2")
TEXT_SHAPE = QColor("#8fd3ff")
EDGE = QColor("#6b7385")
EDGE_ACTIVE = QColor("#ffb547")
HIGHLIGHT = QColor("#ffb547")
FRAME_FILL = QColor(255, 255, 255, 10)
FRAME_BORDER = QColor("#444b5a")
ERROR = QColor("#ff5c5c")

# (keyword in the type or op name, colour of the box's accent stripe)
ACCENTS: tuple[tuple[str, str], ...] = (
    ("attention", "#a98bff"),
    ("attn", "#a98bff"),
    ("softmax", "#c792ea"),
    ("matmul", "#f07178"),
    ("feedforward", "#4fd1c5"),
    ("mlp", "#4fd1c5"),
    ("norm", "#8da2c0"),
    ("embedding", "#f0a84a"),
    ("positional", "#f0a84a"),
    ("linear", "#5fa8ff"),
    ("block", "#7aa2f7"),
    ("add", "#7bd88f"),
    ("gelu", "#e5c07b"),
    ("relu", "#e5c07b"),
    ("dropout", "#6b7385"),
)
OP_ACCENT = "#7f8898"

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


def accent_for(name: str) -> QColor:
    low = name.lower()
    for key, colour in ACCENTS:
        if key in low:
            return QColor(colour)
    return QColor(OP_ACCENT)


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
    if record.dims and len(record.dims) == len(record.shape):
        parts = [d if d and d != "?" else str(s) for d, s in zip(record.dims, record.shape)]
    else:
        parts = [str(s) for s in record.shape]
    return "(" + ", ".join(parts) + ")"


# --------------------------------------------------------------------------- layout


@dataclass
class Node:
    """One drawn thing: a box (a collapsed module call, an op, input/output) or a frame."""

    key: int  # step index, or INPUT / OUTPUT
    frame: bool  # an expanded module call drawn around its children
    title: str
    subtitle: str  # module type ("" for ops)
    shape: str  # output shape label
    accent: QColor
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
            if p is None or (p in self.expanded and owner[p] == p):
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

        top = [s.index for s in steps if s.parent is None]
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
            accent = accent_for(s.op)
        else:
            title, subtitle, accent = s.op, "", accent_for(s.op)
        tip = [f"<b>{s.module or '<root>'}</b> · {s.op}", f"step {s.index + 1}"]
        for name, tid in zip(s.output_names or ("output",) * len(s.outputs), s.outputs):
            rec = trace.tensors[tid]
            tip.append(f"{name}: {rec.shape_str()} {rec.dtype}")
        if s.source is not None and s.source.text:
            tip.append(f"<code>{_html(s.source.text)}</code>")
        if s.error:
            tip.append(f"<span style='color:#ff5c5c'>{_html(s.error)}</span>")
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
                INPUT, False, "input", "", shape_label(trace, tid), QColor("#c8ced8"),
                tooltip="<br>".join(first_inputs),
            )  # fmt: skip
        self.root_outputs = [tid for i in top for tid in trace.steps[i].outputs]
        if self.root_outputs and trace.error is None:
            self.nodes[OUTPUT] = Node(
                OUTPUT, False, "output", "", shape_label(trace, self.root_outputs[0]),
                QColor("#c8ced8"), tooltip="what the model returned",
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


# --------------------------------------------------------------------------- items


class BoxItem(QGraphicsItem):
    """A module call or an op: name, type, output shape; highlighted when current."""

    def __init__(self, node: Node, layout: DiagramLayout, view: DiagramView):
        super().__init__()
        self.node = node
        self._layout = layout
        self._view = view
        self.highlighted = False
        self.hovered = False
        self.setPos(node.rect.topLeft())
        self.setToolTip(node.tooltip)
        self.setAcceptHoverEvents(True)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self.setZValue(2)

    # Qt virtuals (camelCase names, or Qt never calls them)
    def boundingRect(self) -> QRectF:
        return QRectF(0, 0, self.node.rect.width(), self.node.rect.height()).adjusted(-4, -4, 4, 4)

    def paint(self, painter: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        node, layout = self.node, self._layout
        rect = QRectF(0, 0, node.rect.width(), node.rect.height())
        is_op = not node.subtitle
        radius = rect.height() / 2 if is_op and node.key >= 0 else 7.0
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        fill = QColor(BOX_FILL)
        if self.hovered:
            fill = fill.lighter(125)
        if self.highlighted:
            glow = QColor(HIGHLIGHT)
            glow.setAlpha(60)
            painter.setPen(QPen(glow, 7))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(rect, radius, radius)
            fill = QColor("#3a3424")
        border = HIGHLIGHT if self.highlighted else (ERROR if node.error else BOX_BORDER)
        painter.setPen(QPen(border, 2.0 if self.highlighted or node.error else 1.0))
        painter.setBrush(fill)
        painter.drawRoundedRect(rect, radius, radius)
        # accent stripe on the left
        stripe = QPainterPath()
        stripe.addRoundedRect(rect.adjusted(1, 1, -1, -1), radius, radius)
        clip = QPainterPath()
        clip.addRect(QRectF(rect.left(), rect.top(), 5 if not is_op else 8, rect.height()))
        painter.fillPath(stripe.intersected(clip), node.accent)
        # text
        x = H_PAD + (4 if is_op else 2)
        w = rect.width() - x - H_PAD + 4
        y = 5.0 if is_op else 7.0
        lh = layout.line_h
        painter.setPen(ERROR if node.error else TEXT)
        painter.setFont(layout.bold)
        painter.drawText(QRectF(x, y, w, lh), Qt.AlignmentFlag.AlignVCenter, node.title)
        y += lh
        painter.setFont(layout.small)
        if node.subtitle:
            painter.setPen(TEXT_MUTED)
            painter.drawText(QRectF(x, y, w, lh), Qt.AlignmentFlag.AlignVCenter, node.subtitle)
            y += lh
        painter.setPen(TEXT_SHAPE)
        painter.drawText(QRectF(x, y, w, lh), Qt.AlignmentFlag.AlignVCenter, node.shape)
        if node.expandable:  # a "+" badge: double-click to open
            badge = QRectF(rect.right() - 20, rect.top() + 6, 13, 13)
            painter.setPen(QPen(TEXT_MUTED, 1.2))
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(badge, 3, 3)
            c = badge.center()
            painter.drawLine(QPointF(c.x() - 3.5, c.y()), QPointF(c.x() + 3.5, c.y()))
            painter.drawLine(QPointF(c.x(), c.y() - 3.5), QPointF(c.x(), c.y() + 3.5))

    def set_highlighted(self, on: bool) -> None:
        if on != self.highlighted:
            self.highlighted = on
            self.update()

    def hoverEnterEvent(self, event) -> None:
        self.hovered = True
        self.update()

    def hoverLeaveEvent(self, event) -> None:
        self.hovered = False
        self.update()

    def mousePressEvent(self, event) -> None:
        if event.button() == Qt.MouseButton.LeftButton:
            event.accept()
            if self.node.key >= 0:
                self._view.stepActivated.emit(self.node.key)
        else:
            event.ignore()

    def mouseDoubleClickEvent(self, event) -> None:
        event.accept()
        if self.node.expandable:
            self._view.request_toggle(self.node.key)


class FrameItem(QGraphicsItem):
    """An expanded module call drawn as a frame around its children."""

    def __init__(self, node: Node, layout: DiagramLayout, view: DiagramView, depth: int):
        super().__init__()
        self.node = node
        self._layout = layout
        self._view = view
        self.title = layout.frame_title(node.key)
        self.highlighted = False
        self.setPos(node.rect.topLeft())
        self.setToolTip(node.tooltip + "<br><i>double-click the title to collapse</i>")
        self.setZValue(-10 + depth)

    def boundingRect(self) -> QRectF:
        return QRectF(0, 0, self.node.rect.width(), self.node.rect.height()).adjusted(-3, -3, 3, 3)

    def shape(self) -> QPainterPath:
        # only the title bar takes clicks, so a click inside the frame can pan the view
        path = QPainterPath()
        path.addRect(QRectF(0, 0, self.node.rect.width(), FRAME_TITLE))
        return path

    def paint(self, painter: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        rect = QRectF(0, 0, self.node.rect.width(), self.node.rect.height())
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        accent = QColor(self.node.accent)
        fill = QColor(accent)
        fill.setAlpha(16)
        border = QColor(accent)
        border.setAlpha(110)
        if self.highlighted:
            border = HIGHLIGHT
        painter.setBrush(fill)
        pen = QPen(border, 2.0 if self.highlighted else 1.2)
        pen.setStyle(Qt.PenStyle.SolidLine)
        painter.setPen(pen)
        painter.drawRoundedRect(rect, 10, 10)
        painter.setFont(self._layout.bold)
        painter.setPen(HIGHLIGHT if self.highlighted else accent.lighter(120))
        text_rect = QRectF(12, 4, rect.width() - 40, FRAME_TITLE - 6)
        painter.drawText(text_rect, Qt.AlignmentFlag.AlignVCenter, self.title)
        # a "−" badge: double-click to collapse
        badge = QRectF(rect.right() - 22, 7, 13, 13)
        painter.setPen(QPen(TEXT_MUTED, 1.2))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawRoundedRect(badge, 3, 3)
        c = badge.center()
        painter.drawLine(QPointF(c.x() - 3.5, c.y()), QPointF(c.x() + 3.5, c.y()))

    def set_highlighted(self, on: bool) -> None:
        if on != self.highlighted:
            self.highlighted = on
            self.update()

    def mousePressEvent(self, event) -> None:
        if event.button() == Qt.MouseButton.LeftButton:
            event.accept()
            self._view.stepActivated.emit(self.node.key)
        else:
            event.ignore()

    def mouseDoubleClickEvent(self, event) -> None:
        event.accept()
        self._view.request_toggle(self.node.key)


class EdgeItem(QGraphicsItem):
    """A data-flow arrow: a smooth cubic path ending in an arrowhead."""

    def __init__(self, path: QPainterPath, tip: QPointF, angle_deg: float, detour: bool):
        super().__init__()
        self.path = path
        self.detour = detour
        self.active = False
        import math

        a = math.radians(angle_deg)
        # arrowhead points back along the direction of travel
        back = QPointF(-math.cos(a), math.sin(a))
        side = QPointF(-back.y(), back.x())
        base = tip + back * ARROW
        self.arrow = QPolygonF([tip, base + side * (ARROW * 0.5), base - side * (ARROW * 0.5)])
        self._bounds = path.boundingRect().united(self.arrow.boundingRect()).adjusted(-3, -3, 3, 3)
        self.setZValue(1)

    def boundingRect(self) -> QRectF:
        return self._bounds

    def shape(self) -> QPainterPath:
        stroker = QPainterPathStroker()
        stroker.setWidth(6)
        return stroker.createStroke(self.path)

    def paint(self, painter: QPainter, option: QStyleOptionGraphicsItem, widget=None) -> None:
        colour = EDGE_ACTIVE if self.active else EDGE
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pen = QPen(colour, 2.0 if self.active else 1.4)
        if self.detour and not self.active:
            pen.setColor(QColor("#7bd88f").darker(115))  # residual / skip paths
        painter.setPen(pen)
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawPath(self.path)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(pen.color())
        painter.drawPolygon(self.arrow)

    def set_active(self, on: bool) -> None:
        if on != self.active:
            self.active = on
            self.update()


# --------------------------------------------------------------------------- the view


class DiagramView(QGraphicsView):
    """Shows a :class:`DiagramLayout`; wheel zooms, drag pans, double-click expands.

    Signals: ``stepActivated(int)`` when a box is clicked (jump to its step),
    ``layoutChanged()`` after a box was expanded or collapsed.
    """

    stepActivated = Signal(int)
    layoutChanged = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("diagram")
        self.setScene(QGraphicsScene(self))
        self.setRenderHints(QPainter.RenderHint.Antialiasing | QPainter.RenderHint.TextAntialiasing)
        self.setDragMode(QGraphicsView.DragMode.ScrollHandDrag)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.setResizeAnchor(QGraphicsView.ViewportAnchor.AnchorViewCenter)
        self.setViewportUpdateMode(QGraphicsView.ViewportUpdateMode.SmartViewportUpdate)
        self.setBackgroundBrush(QBrush(BACKGROUND))
        self.setFrameShape(QGraphicsView.Shape.NoFrame)
        self.trace: Trace | None = None
        self.layout_: DiagramLayout | None = None
        self.expanded: set[int] = set()
        self.items_by_key: dict[int, QGraphicsItem] = {}
        self.edges_by_key: dict[int, list[EdgeItem]] = {}
        self.current_step: int | None = None
        self.highlighted_key: int | None = None
        self._pending_toggle: int | None = None

    # ---- content

    def set_trace(self, trace: Trace | None) -> None:
        """Show a new trace: the top-level call open, everything below it collapsed."""
        self.trace = trace
        self.current_step = None
        self.expanded = set()
        if trace is not None and trace.steps:
            self.expanded = {s.index for s in trace.steps if s.parent is None}
        self.rebuild()
        self.reset_zoom()

    def rebuild(self) -> None:
        scene = self.scene()
        scene.clear()
        self.items_by_key = {}
        self.edges_by_key = {}
        self.highlighted_key = None
        if self.trace is None or not self.trace.steps:
            self.layout_ = None
            return
        layout = DiagramLayout(self.trace, self.expanded, self.font())
        self.layout_ = layout
        self.expanded = set(layout.expanded)
        for key, node in layout.nodes.items():
            if node.frame:
                depth = len(layout._chain(key))
                item: QGraphicsItem = FrameItem(node, layout, self, depth)
            else:
                item = BoxItem(node, layout, self)
            scene.addItem(item)
            self.items_by_key[key] = item
        for u, v in layout.edges:
            edge = self._edge_item(layout, u, v)
            scene.addItem(edge)
            self.edges_by_key.setdefault(u, []).append(edge)
            self.edges_by_key.setdefault(v, []).append(edge)
        bounds = layout.bounding_rect().adjusted(-140, -60, 140, 60)
        scene.setSceneRect(bounds)
        if self.current_step is not None:
            self.set_current(self.current_step, scroll=False)

    def _edge_item(self, layout: DiagramLayout, u: int, v: int) -> EdgeItem:
        src, dst = layout.nodes[u].rect, layout.nodes[v].rect
        start = QPointF(src.center().x(), src.bottom())
        end = QPointF(dst.center().x(), dst.top())
        if end.y() > start.y() + 1:
            path = QPainterPath(start)
            dy = (end.y() - start.y()) * 0.5
            path.cubicTo(start + QPointF(0, dy), end - QPointF(0, dy), end)
            blockers = [
                n.rect
                for k, n in layout.nodes.items()
                if not n.frame
                and k not in (u, v)
                and n.rect.top() < end.y() - 1
                and n.rect.bottom() > start.y() + 1
            ]
            if not any(path.intersects(r.adjusted(-4, -4, 4, 4)) for r in blockers):
                return EdgeItem(path, end, 270.0, detour=False)
            # detour beside everything it would cross: the residual and skip paths
            band = blockers + [
                n.rect
                for k, n in layout.nodes.items()
                if n.frame
                and not layout.is_ancestor(k, u)
                and not layout.is_ancestor(k, v)
                and n.rect.top() < end.y()
                and n.rect.bottom() > start.y()
            ]
            others = [
                n.rect.adjusted(-3, -3, 3, 3)
                for k, n in layout.nodes.items()
                if not n.frame and k not in (u, v)
            ]
            sides = (+1, -1) if src.center().x() >= dst.center().x() - 1 else (-1, +1)
            first = None
            for side in sides:
                candidate = self._detour(src, dst, band, side)
                if first is None:
                    first = candidate
                if not any(candidate[0].intersects(r) for r in others):
                    return EdgeItem(*candidate, detour=True)
            return EdgeItem(*first, detour=True)
        # same row or upwards (should not happen in a DAG layout): a gentle side curve
        a = QPointF(src.right(), src.center().y())
        b = QPointF(dst.left(), dst.center().y())
        path = QPainterPath(a)
        path.cubicTo(a + QPointF(30, 0), b - QPointF(30, 0), b)
        return EdgeItem(path, b, 0.0, detour=False)

    @staticmethod
    def _detour(src: QRectF, dst: QRectF, band: list[QRectF], side: int):
        """A path leaving ``src`` sideways, running down a lane clear of ``band``, into ``dst``."""
        if side > 0:
            lane = max(r.right() for r in [*band, src, dst]) + LANE_GAP
            a, b = QPointF(src.right(), src.center().y()), QPointF(dst.right(), dst.center().y())
        else:
            lane = min(r.left() for r in [*band, src, dst]) - LANE_GAP
            a, b = QPointF(src.left(), src.center().y()), QPointF(dst.left(), dst.center().y())
        path = QPainterPath(a)
        path.cubicTo(QPointF(lane, a.y()), QPointF(lane, a.y()), QPointF(lane, a.y() + 18))
        path.lineTo(QPointF(lane, b.y() - 18))
        path.cubicTo(QPointF(lane, b.y()), QPointF(lane, b.y()), b)
        return path, b, 180.0 if side > 0 else 0.0

    # ---- expansion

    def request_toggle(self, key: int) -> None:
        """Toggle after the current mouse event returns (the item is deleted by a rebuild)."""
        self._pending_toggle = key
        QTimer.singleShot(0, self._apply_pending_toggle)

    def _apply_pending_toggle(self) -> None:
        key, self._pending_toggle = self._pending_toggle, None
        if key is not None:
            self.toggle(key)

    def toggle(self, key: int) -> None:
        if key in self.expanded:
            self.collapse(key)
        else:
            self.expand(key)

    def expand(self, key: int) -> None:
        if self.trace is None or key in self.expanded:
            return
        # opening a box inside a collapsed ancestor opens the ancestors too
        step = self.trace.steps[key]
        self.expanded.add(key)
        while step.parent is not None:
            self.expanded.add(step.parent)
            step = self.trace.steps[step.parent]
        self._relayout(key)

    def collapse(self, key: int) -> None:
        if key not in self.expanded:
            return
        self.expanded.discard(key)
        self._relayout(key)

    def set_expanded(self, keys: Iterable[int]) -> None:
        self.expanded = set(keys)
        self.rebuild()
        self.layoutChanged.emit()

    def _relayout(self, anchor_key: int) -> None:
        """Rebuild, keeping the toggled box where it was on screen."""
        old = self.items_by_key.get(anchor_key)
        old_screen = self.mapFromScene(old.pos()) if old is not None else None
        self.rebuild()
        new = self.items_by_key.get(anchor_key)
        if old_screen is not None and new is not None:
            delta = self.mapFromScene(new.pos()) - old_screen
            h, v = self.horizontalScrollBar(), self.verticalScrollBar()
            h.setValue(h.value() + delta.x())
            v.setValue(v.value() + delta.y())
        self.layoutChanged.emit()

    # ---- the current step

    def key_for_step(self, index: int) -> int | None:
        """The visible box or frame standing for step ``index``."""
        if self.layout_ is None or not 0 <= index < len(self.layout_.owner):
            return None
        return self.layout_.owner[index]

    def set_current(self, index: int, scroll: bool = True) -> None:
        """Highlight the box of step ``index`` (or its collapsed ancestor) and show it."""
        self.current_step = index
        key = self.key_for_step(index)
        if key == self.highlighted_key:
            if scroll and key is not None and key in self.items_by_key:
                self._scroll_to(self.items_by_key[key])
            return
        if self.highlighted_key is not None:
            old = self.items_by_key.get(self.highlighted_key)
            if old is not None:
                old.set_highlighted(False)
            for edge in self.edges_by_key.get(self.highlighted_key, ()):
                edge.set_active(False)
        self.highlighted_key = key
        item = self.items_by_key.get(key) if key is not None else None
        if item is None:
            return
        item.set_highlighted(True)
        for edge in self.edges_by_key.get(key, ()):
            edge.set_active(True)
        if scroll:
            self._scroll_to(item)

    def _scroll_to(self, item: QGraphicsItem) -> None:
        rect = item.sceneBoundingRect()
        if isinstance(item, FrameItem):  # a big frame: show its title bar
            rect = QRectF(rect.left(), rect.top(), rect.width(), FRAME_TITLE * 3)
        self._ensure_visible(rect)

    def _ensure_visible(self, rect: QRectF) -> None:
        visible = self.mapToScene(self.viewport().rect()).boundingRect()
        if not visible.contains(rect):
            self.ensureVisible(rect, 60, 60)

    # ---- zoom and pan

    def wheelEvent(self, event) -> None:
        delta = event.angleDelta().y()
        if delta == 0:
            return
        self.zoom(1.0015**delta)
        event.accept()

    def zoom(self, factor: float) -> None:
        current = self.transform().m11()
        factor = max(0.05 / current, min(4.0 / current, factor))
        self.scale(factor, factor)

    def zoom_level(self) -> float:
        return self.transform().m11()

    def fit(self) -> None:
        """Fit the whole diagram in the window (never larger than 1.5x)."""
        if self.layout_ is None:
            return
        rect = self.layout_.bounding_rect().adjusted(-30, -30, 30, 30)
        self.fitInView(rect, Qt.AspectRatioMode.KeepAspectRatio)
        if self.zoom_level() > 1.5:
            self.resetTransform()
            self.scale(1.5, 1.5)
            self.centerOn(rect.center())

    def reset_zoom(self) -> None:
        """Readable size: fit when the diagram is small enough, else 85% from the top."""
        self.resetTransform()
        if self.layout_ is None:
            return
        rect = self.layout_.bounding_rect().adjusted(-30, -30, 30, 30)
        view = self.viewport().rect()
        scale = min(view.width() / max(rect.width(), 1), view.height() / max(rect.height(), 1))
        scale = max(0.75, min(1.0, scale))
        self.scale(scale, scale)
        self.centerOn(QPointF(rect.center().x(), rect.top() + view.height() / scale / 2))

    # ---- export

    def export_image(self, path: str | Path) -> Path:
        """Write the whole diagram as PNG (2x) or SVG, by the file's suffix."""
        path = Path(path)
        scene = self.scene()
        source = scene.itemsBoundingRect().adjusted(-20, -20, 20, 20)
        if path.suffix.lower() == ".svg":
            from PySide6.QtSvg import QSvgGenerator

            generator = QSvgGenerator()
            generator.setFileName(str(path))
            generator.setSize(source.size().toSize())
            generator.setViewBox(QRectF(0, 0, source.width(), source.height()))
            generator.setTitle("Scratchformer block diagram")
            painter = QPainter(generator)
            painter.fillRect(QRectF(0, 0, source.width(), source.height()), BACKGROUND)
            scene.render(painter, QRectF(0, 0, source.width(), source.height()), source)
            painter.end()
        else:
            scale = 2.0
            image = QImage(
                int(source.width() * scale), int(source.height() * scale),
                QImage.Format.Format_ARGB32,
            )  # fmt: skip
            image.fill(BACKGROUND)
            painter = QPainter(image)
            painter.setRenderHints(
                QPainter.RenderHint.Antialiasing | QPainter.RenderHint.TextAntialiasing
            )
            scene.render(painter, QRectF(image.rect()), source)
            painter.end()
            if not image.save(str(path)):
                raise OSError(f"Could not write {path}")
        return path
