"""The block diagram: modules as boxes, data flow as arrows, the current step highlighted.

:class:`DiagramView` (Qt) draws a :class:`~app.diagram.plan.layout.DiagramLayout` in a
``QGraphicsScene`` with the items of :mod:`app.diagram.items`, and handles clicks,
double-clicks (expand / collapse), wheel zoom, drag pan and fit-to-window.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QPoint, QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import (
    QBrush,
    QColor,
    QImage,
    QPainter,
    QPainterPath,
)
from PySide6.QtWidgets import (
    QGraphicsItem,
    QGraphicsScene,
    QGraphicsView,
    QWidget,
)

from app import theme
from app.diagram.grad_tints import grad_tints
from app.diagram.items import BoxItem, DiagramFonts, EdgeItem, FrameItem, to_qpoint, to_qrect
from app.diagram.plan.folding import Run, TraceIndex
from app.diagram.plan.geometry import Rect
from app.diagram.plan.layout import FRAME_TITLE, DiagramLayout
from app.diagram.plan.routing import RectIndex, detour_lane, edge_ends

if TYPE_CHECKING:  # pragma: no cover
    from tracing import Trace


class DiagramView(QGraphicsView):
    """Shows a :class:`DiagramLayout`; wheel zooms, drag pans, double-click expands.

    Signals: ``stepActivated(int)`` when a box is clicked (jump to its step),
    ``layoutChanged()`` after a box was expanded or collapsed, ``stepContextMenu(step,
    global position)`` on a right-click on a box (the edit actions use it).
    """

    stepActivated = Signal(int)
    layoutChanged = Signal()
    stepContextMenu = Signal(int, QPoint)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("diagram")
        self.setScene(QGraphicsScene(self))
        self.setRenderHints(QPainter.RenderHint.Antialiasing | QPainter.RenderHint.TextAntialiasing)
        self.setDragMode(QGraphicsView.DragMode.ScrollHandDrag)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.setResizeAnchor(QGraphicsView.ViewportAnchor.AnchorViewCenter)
        self.setViewportUpdateMode(QGraphicsView.ViewportUpdateMode.SmartViewportUpdate)
        self.setBackgroundBrush(QBrush(QColor(theme.BACKGROUND)))
        self.setFrameShape(QGraphicsView.Shape.NoFrame)
        self.trace: Trace | None = None
        self.layout_: DiagramLayout | None = None
        self.fonts = DiagramFonts(self.font())
        self.expanded: set[int] = set()
        self.open_folds: set[Run] = set()
        self.fold_repetition = True
        self.index: TraceIndex | None = None
        self.items_by_key: dict[int, QGraphicsItem] = {}
        self.edges_by_key: dict[int, list[EdgeItem]] = {}
        self.current_step: int | None = None
        self.highlighted_key: int | None = None
        self._pending_toggle: int | None = None
        self.grad_colouring = False  # boxes filled by their gradient norm (log scale)
        self.tints: dict[int, QColor] = {}

    # ---- content

    def set_trace(self, trace: Trace | None) -> None:
        """Show a new trace: the top-level call open, everything below it collapsed."""
        self.trace = trace
        self.current_step = None
        self.expanded = set()
        self.open_folds = set()
        self.index = TraceIndex(trace) if trace is not None else None
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
        self.fonts = DiagramFonts(self.font())
        layout = DiagramLayout(
            self.trace,
            self.expanded,
            self.fonts.measure,
            index=self.index,
            open_folds=self.open_folds,
            focus=self.current_step,
            fold=self.fold_repetition,
        )
        self.layout_ = layout
        self.tints = grad_tints(self.trace, layout.nodes) if self.grad_colouring else {}
        self.expanded = set(layout.expanded)
        for key, node in layout.nodes.items():
            if node.frame:
                depth = len(layout._chain(key))
                item: QGraphicsItem = FrameItem(node, layout, self, depth)
            else:
                item = BoxItem(node, self)
            scene.addItem(item)
            self.items_by_key[key] = item
        qrects = {key: to_qrect(node.rect) for key, node in layout.nodes.items()}
        boxes = RectIndex((k, n.rect) for k, n in layout.nodes.items() if not n.frame)
        frames = [(k, n.rect) for k, n in layout.nodes.items() if n.frame]
        for u, v in layout.edges:
            edge = self._edge_item(layout, u, v, boxes, frames, qrects)
            scene.addItem(edge)
            self.edges_by_key.setdefault(u, []).append(edge)
            self.edges_by_key.setdefault(v, []).append(edge)
        bounds = to_qrect(layout.bounding_rect()).adjusted(-140, -60, 140, 60)
        scene.setSceneRect(bounds)
        if self.current_step is not None:
            self.set_current(self.current_step, scroll=False)

    @staticmethod
    def _edge_item(
        layout: DiagramLayout,
        u: int,
        v: int,
        boxes: RectIndex,
        frames: list[tuple[int, Rect]],
        qrects: dict[int, QRectF],
    ) -> EdgeItem:
        """An arrow from ``u`` to ``v``: a curve, or a detour beside the boxes it would cross.

        Only the boxes in the rows the edge spans are tested (``boxes`` is indexed by row
        band), so routing costs what the edge passes, not the whole diagram. Where the arrow
        runs is plain geometry (:mod:`app.diagram.plan.routing`); whether a curve crosses a box is
        asked of Qt's path (``qrects`` holds each node's rectangle as Qt's).
        """
        src, dst = layout.nodes[u].rect, layout.nodes[v].rect
        start, end = (to_qpoint(p) for p in edge_ends(src, dst))
        if end.y() > start.y() + 1:
            path = QPainterPath(start)
            dy = (end.y() - start.y()) * 0.5
            path.cubicTo(start + QPointF(0, dy), end - QPointF(0, dy), end)
            blockers = [k for k, _ in boxes.between(start.y() + 1, end.y() - 1) if k not in (u, v)]
            if not any(path.intersects(qrects[k].adjusted(-4, -4, 4, 4)) for k in blockers):
                return EdgeItem(path, end, 270.0, detour=False)
            # detour beside everything it would cross: the residual and skip paths
            band = [layout.nodes[k].rect for k in blockers] + [
                r
                for k, r in frames
                if not layout.is_ancestor(k, u)
                and not layout.is_ancestor(k, v)
                and r.top < end.y()
                and r.bottom > start.y()
            ]
            others = [
                qrects[k].adjusted(-3, -3, 3, 3)
                for k, _ in boxes.between(src.top - 3, dst.bottom + 3)
                if k not in (u, v)
            ]
            sides = (+1, -1) if src.center.x >= dst.center.x - 1 else (-1, +1)
            first = None
            for side in sides:
                candidate = _detour(src, dst, band, side)
                if first is None:
                    first = candidate
                if not any(candidate[0].intersects(r) for r in others):
                    return EdgeItem(*candidate, detour=True)
            return EdgeItem(*first, detour=True)
        # same row or upwards (should not happen in a DAG layout): a gentle side curve
        a = QPointF(src.right, src.center.y)
        b = QPointF(dst.left, dst.center.y)
        path = QPainterPath(a)
        path.cubicTo(a + QPointF(30, 0), b - QPointF(30, 0), b)
        return EdgeItem(path, b, 0.0, detour=False)

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
        run = self.layout_.folds.get(key) if self.layout_ is not None else None
        if run is not None:  # a folded run: open it, or fold it again
            self.open_folds ^= {run}
            self._relayout(key)
            return
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

    def set_fold_repetition(self, on: bool) -> None:
        """Fold repeated calls and identical sibling blocks into one box (on by default)."""
        self.fold_repetition = on
        self.rebuild()
        self.layoutChanged.emit()

    def expandable_keys(self) -> list[int]:
        """Visible boxes a double-click would open (collapsed calls and folded runs)."""
        if self.layout_ is None:
            return []
        return [k for k, n in self.layout_.nodes.items() if n.expandable and not n.frame]

    def set_expanded(self, keys: Iterable[int]) -> None:
        self.expanded = set(keys)
        self.rebuild()
        self.layoutChanged.emit()

    def _relayout(self, anchor_key: int | None) -> None:
        """Rebuild, keeping the toggled box where it was on screen."""
        old = self.items_by_key.get(anchor_key) if anchor_key is not None else None
        old_screen = self.mapFromScene(old.pos()) if old is not None else None
        anchor_step = old.node.step if old is not None else None
        self.rebuild()
        new = self.items_by_key.get(anchor_key) if anchor_key is not None else None
        if anchor_key is not None and anchor_key < 0 and self.layout_ is not None:
            # fold keys are renumbered by each layout: find the box by its first step
            new = next(
                (self.items_by_key[k] for k, n in self.layout_.nodes.items()
                 if k in self.items_by_key and n.step == anchor_step and k < 0),
                new,
            )  # fmt: skip
        if old_screen is not None and new is not None:
            delta = self.mapFromScene(new.pos()) - old_screen
            h, v = self.horizontalScrollBar(), self.verticalScrollBar()
            h.setValue(h.value() + delta.x())
            v.setValue(v.value() + delta.y())
        self.layoutChanged.emit()

    def set_grad_colouring(self, on: bool) -> None:
        """Fill each box by the norm of its output's gradient, on a log scale from blue
        (smallest) to red (largest); non-finite in the error colour."""
        self.grad_colouring = on
        self.rebuild()

    # ---- the current step

    def key_for_step(self, index: int) -> int | None:
        """The visible box or frame standing for step ``index``."""
        if self.layout_ is None or not 0 <= index < len(self.layout_.trace.steps):
            return None
        return self.layout_.owner_of(index)

    def set_current(self, index: int, scroll: bool = True) -> None:
        """Highlight the box of step ``index`` (or its collapsed ancestor) and show it."""
        self.current_step = index
        if self.layout_ is not None and self.layout_.needs_focus(index):
            # the step is inside a folded run: show the repetition holding it
            self._relayout(None)
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

    def reveal(self, index: int) -> None:
        """Open every box around step ``index`` so the step itself has a box, highlight it
        and scroll it into view: what a jump (find, go to step, N, a breakpoint) does."""
        if self.trace is None or not 0 <= index < len(self.trace.steps):
            return
        steps = self.trace.steps
        wanted: set[int] = set()
        parent = steps[index].parent
        while parent is not None:
            wanted.add(parent)
            parent = steps[parent].parent
        self.current_step = index
        if not wanted <= self.expanded:
            self.expanded |= wanted
            self.rebuild()  # re-highlights the current step, without scrolling
            self.layoutChanged.emit()
        self.set_current(index, scroll=True)

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

    def contextMenuEvent(self, event) -> None:
        item = self.itemAt(event.pos())
        while item is not None and not hasattr(item, "node"):
            item = item.parentItem()
        if item is None or item.node.key < 0:  # the canvas, input/output, a folded run
            super().contextMenuEvent(event)
            return
        self.stepContextMenu.emit(item.node.key, event.globalPos())
        event.accept()

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
        rect = to_qrect(self.layout_.bounding_rect()).adjusted(-30, -30, 30, 30)
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
        rect = to_qrect(self.layout_.bounding_rect()).adjusted(-30, -30, 30, 30)
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
            # deferred: QtSvg loads only when someone exports an SVG, not at start-up
            from PySide6.QtSvg import QSvgGenerator

            generator = QSvgGenerator()
            generator.setFileName(str(path))
            generator.setSize(source.size().toSize())
            generator.setViewBox(QRectF(0, 0, source.width(), source.height()))
            generator.setTitle("Scratchformer block diagram")
            painter = QPainter(generator)
            page = QRectF(0, 0, source.width(), source.height())
            painter.fillRect(page, QColor(theme.BACKGROUND))
            scene.render(painter, page, source)
            painter.end()
        else:
            scale = 2.0
            image = QImage(
                int(source.width() * scale), int(source.height() * scale),
                QImage.Format.Format_ARGB32,
            )  # fmt: skip
            image.fill(QColor(theme.BACKGROUND))
            painter = QPainter(image)
            painter.setRenderHints(
                QPainter.RenderHint.Antialiasing | QPainter.RenderHint.TextAntialiasing
            )
            scene.render(painter, QRectF(image.rect()), source)
            painter.end()
            if not image.save(str(path)):
                raise OSError(f"Could not write {path}")
        return path


def _detour(src: Rect, dst: Rect, band: list[Rect], side: int):
    """A path leaving ``src`` sideways, running down a lane clear of ``band``, into ``dst``."""
    lane = detour_lane(src, dst, band, side)
    if side > 0:
        a, b = QPointF(src.right, src.center.y), QPointF(dst.right, dst.center.y)
    else:
        a, b = QPointF(src.left, src.center.y), QPointF(dst.left, dst.center.y)
    path = QPainterPath(a)
    path.cubicTo(QPointF(lane, a.y()), QPointF(lane, a.y()), QPointF(lane, a.y() + 18))
    path.lineTo(QPointF(lane, b.y() - 18))
    path.cubicTo(QPointF(lane, b.y()), QPointF(lane, b.y()), b)
    return path, b, 180.0 if side > 0 else 0.0
