"""The attention panel: one attention map large, and every layer x head as thumbnails.

An attention map ``A`` of shape ``(T, T)`` (one batch element, one head) says how much
each **query** position (a row) takes from each **key** position (a column); every row
sums to 1, and with a causal mask everything right of the diagonal is 0. Rows and columns
are labelled with the prompt's tokens, so a pattern (the diagonal of "look at myself", the
first column of "look at the start", the anti-diagonal of the demo's string reversal) can
be read off directly.

- **Big view**: the map of the chosen layer and head (``trace.attention_maps()[path][b, h]``)
  on a sequential colour map from 0.
- **Grid**: every layer (rows) x head (columns) as a thumbnail, each normalised to its own
  maximum so faint heads still show their shape. Clicking a thumbnail opens it in the big
  view and emits ``stepRequested`` with the step that computed that layer's weights, so the
  rest of the debugger jumps there too.

Thumbnails are rendered once per trace (and per batch element) into ``QImage`` objects and
painted by one widget, so a 12 x 12 grid costs one paint, not 144 plot items.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from PySide6.QtCore import QEvent, QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QFont, QFontMetrics, QImage, QMouseEvent, QPainter, QPalette, QPen
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QToolButton,
    QToolTip,
    QWidget,
)

from app.theme import PROBABILITY_CMAP
from app.widgets.common import ElidedLabel, column
from app.widgets.heatmap import HeatmapView, colormap
from app.widgets.tensor_view import first_nonfinite_slice
from tracing.record import Trace

THUMB_PIXELS = 48
"""Thumbnails are pooled down to at most this many pixels per side before colouring."""


# --------------------------------------------------------------------------- trace helpers


def attention_maps(trace: Trace) -> dict[str, torch.Tensor]:
    """``trace.attention_maps()``: ``{module path: (B, H, T, T)}`` in the order layers ran."""
    return dict(trace.attention_maps())


def _base(path: str) -> str:
    """``blocks.0.attn#1`` (second call of a module) -> ``blocks.0.attn``."""
    return path.split("#", 1)[0]


def layer_labels(paths: list[str]) -> list[str]:
    """A short label per attention map, by its module: the layer number the path holds and,
    where the maps of a layer differ by name, that name — ``L0``, ``L1`` for one attention
    per block; ``L0 self_attn``, ``L0 multihead_attn`` for nn.TransformerDecoder's self- and
    cross-attention; the whole path when it holds no number; ``#1`` for a second call. The
    layer number is the first one that differs between the maps (x-transformers' layers are
    ``attn_layers.layers.0.1.attend``, ``attn_layers.layers.2.1.attend``: ``L0``, ``L2``),
    else the last one."""
    parsed: list[tuple[str | None, str, str]] = []
    varies = _varying_number(paths)
    for path in paths:
        base, _, call = path.partition("#")
        parts = base.split(".")
        numbered = [i for i, part in enumerate(parts) if part.isdigit()]
        at = varies if varies in numbered else max(numbered, default=None)
        if at is None:
            parsed.append((None, base or "<root>", call))
        else:
            parsed.append((parts[at], ".".join(parts[at + 1 :]), call))
    names = {rest for number, rest, _ in parsed if number is not None}
    labels = []
    for number, rest, call in parsed:
        suffix = f"#{call}" if call else ""
        if number is None:
            labels.append(rest + suffix)
        elif len(names) <= 1:
            labels.append(f"L{number}{suffix}")
        else:
            labels.append(f"L{number} {rest}{suffix}".rstrip())
    return labels


def _varying_number(paths: list[str]) -> int | None:
    """The first position of a dotted path at which the maps' numbers differ, if any."""
    seen: dict[int, set[str]] = {}
    for path in paths:
        for i, part in enumerate(_base(path).split(".")):
            if part.isdigit():
                seen.setdefault(i, set()).add(part)
    return min((i for i, values in seen.items() if len(values) > 1), default=None)


def attention_steps(trace: Trace, paths: list[str]) -> list[int | None]:
    """For each attention path: the step that produced its weights (else its module call)."""
    from tracing.analysis.attention_maps import attention_map_records

    records = attention_map_records(trace)
    result: list[int | None] = []
    for path in paths:
        tensor_id = records.get(path)
        producer = trace.tensors[tensor_id].producer if tensor_id is not None else None
        if producer is None:
            calls = trace.module_steps(_base(path))
            producer = calls[0].index if calls else None
        result.append(producer)
    return result


def layer_lookup(trace: Trace, paths: list[str]) -> dict[str, int]:
    """Module path -> layer index, for every module path a step ran in.

    A step belongs to a layer when it ran inside that layer's attention module, or in a
    module that contains exactly one attention module (its decoder block, its
    multi-head-attention wrapper).
    """
    # linear in modules x depth: walk each module's own prefixes, never every pair
    first: dict[str, int] = {}  # attention module path -> its first layer index
    for i, path in enumerate(paths):
        first.setdefault(_base(path), i)
    holders: dict[str, list[int]] = {}  # a module -> the attention layers strictly inside it
    for base, i in first.items():
        parts = base.split(".")
        for k in range(len(parts)):
            holders.setdefault(".".join(parts[:k]), []).append(i)
    lookup: dict[str, int] = {}
    for module in {step.module for step in trace.steps}:
        parts = module.split(".") if module else []
        for k in range(len(parts), 0, -1):  # the innermost attention module around it
            index = first.get(".".join(parts[:k]))
            if index is not None:
                lookup[module] = index
                break
        else:
            inside = holders.get(module, ()) if module else ()
            if len(inside) == 1:
                lookup[module] = inside[0]
    return lookup


def thumbnail_images(maps: list[torch.Tensor], batch: int = 0) -> list[list[QImage]]:
    """One coloured ``QImage`` per (layer, head), each scaled to its own maximum."""
    lut = colormap(PROBABILITY_CMAP).getLookupTable(0.0, 1.0, 256, alpha=False)  # (256, 3)
    images: list[list[QImage]] = []
    for layer_map in maps:
        a = layer_map[min(batch, layer_map.shape[0] - 1)].detach().float()  # (H, T, T)
        a = torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
        if max(a.shape[-2:]) > THUMB_PIXELS:
            a = F.adaptive_avg_pool2d(a.unsqueeze(1), THUMB_PIXELS).squeeze(1)
        peak = a.flatten(1).amax(dim=1).clamp_min(1e-12)[:, None, None]
        index = (a / peak * 255).round().clamp(0, 255).to(torch.uint8).numpy()
        rgb = np.ascontiguousarray(lut[index])  # (H, t, t, 3) uint8
        row = []
        for head in range(rgb.shape[0]):
            h, w = rgb.shape[1:3]
            image = QImage(rgb[head].data, w, h, 3 * w, QImage.Format.Format_RGB888)
            row.append(image.copy())  # own the pixels: the numpy buffer goes away
        images.append(row)
    return images


# --------------------------------------------------------------------------- grid


class AttentionGrid(QWidget):
    """Every layer x head attention map as a clickable thumbnail (one widget, one paint)."""

    cellClicked = Signal(int, int)
    cellContextMenu = Signal(int, int, QPoint)  # layer, head, global position (right-click)
    """(layer, head) of the thumbnail that was clicked."""

    LABEL_WIDTH = 34  # at least; as wide as the widest row label
    HEADER_HEIGHT = 18
    GAP = 3
    MIN_CELL, MAX_CELL = 18, 64

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._images: list[list[QImage]] = []
        self._names: list[str] = []
        self._labels: list[str] = []
        self._label_width = self.LABEL_WIDTH
        self._selected: tuple[int, int] | None = None
        self._cell = 40
        self.setMouseTracking(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        small = self.font()
        small.setPointSizeF(max(7.0, small.pointSizeF() - 1.5))
        self._small = small

    def set_images(
        self, images: list[list[QImage]], names: list[str], labels: list[str] | None = None
    ) -> None:
        self._images, self._names = images, names
        self._labels = labels or [f"L{i}" for i in range(len(images))]
        fm = QFontMetrics(self._small)
        widest = max((fm.horizontalAdvance(t) for t in self._labels), default=0)
        self._label_width = max(self.LABEL_WIDTH, widest + 10)
        self._relayout()
        self.update()

    def set_selected(self, layer: int, head: int) -> None:
        if self._selected != (layer, head):
            self._selected = (layer, head)
            self.update()

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, heads) on show."""
        heads = max((len(row) for row in self._images), default=0)
        return len(self._images), heads

    # ---- geometry

    def _relayout(self) -> None:
        layers, heads = self.shape
        if heads:
            free = self.width() - self._label_width - self.GAP * heads
            self._cell = max(self.MIN_CELL, min(self.MAX_CELL, free // heads))
        height = self.HEADER_HEIGHT + layers * (self._cell + self.GAP) + self.GAP
        self.setMinimumHeight(height)

    def sizeHint(self) -> QSize:
        layers, heads = self.shape
        width = self._label_width + heads * (40 + self.GAP)
        return QSize(width, self.HEADER_HEIGHT + layers * (40 + self.GAP))

    def cell_rect(self, layer: int, head: int) -> QRect:
        """Where the thumbnail of (layer, head) is drawn, in widget pixels."""
        step = self._cell + self.GAP
        return QRect(
            self._label_width + head * step,
            self.HEADER_HEIGHT + layer * step,
            self._cell,
            self._cell,
        )

    def cell_at(self, pos: QPoint) -> tuple[int, int] | None:
        step = self._cell + self.GAP
        x, y = pos.x() - self._label_width, pos.y() - self.HEADER_HEIGHT
        if x < 0 or y < 0:
            return None
        head, layer = x // step, y // step
        if x % step >= self._cell or y % step >= self._cell:
            return None  # in a gap
        if layer < len(self._images) and head < len(self._images[layer]):
            return int(layer), int(head)
        return None

    # ---- Qt overrides (camelCase, or Qt never calls them)

    def resizeEvent(self, event) -> None:
        self._relayout()
        super().resizeEvent(event)

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        palette = self.palette()
        painter.fillRect(self.rect(), palette.color(QPalette.ColorRole.Base))
        text = palette.color(QPalette.ColorRole.Text)
        painter.setFont(self._small)
        layers, heads = self.shape
        for head in range(heads):
            r = self.cell_rect(0, head)
            painter.setPen(text)
            painter.drawText(
                QRect(r.x(), 0, r.width(), self.HEADER_HEIGHT),
                Qt.AlignmentFlag.AlignCenter,
                f"H{head}",
            )
        for layer, row in enumerate(self._images):
            r = self.cell_rect(layer, 0)
            painter.setPen(text)
            painter.drawText(
                QRect(0, r.y(), self._label_width - 4, r.height()),
                Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
                self._labels[layer] if layer < len(self._labels) else f"L{layer}",
            )
            for head, image in enumerate(row):
                painter.drawImage(self.cell_rect(layer, head), image)
        if self._selected is not None:
            layer, head = self._selected
            if layer < layers and head < heads:
                pen = QPen(palette.color(QPalette.ColorRole.Highlight).lighter(160), 3)
                painter.setPen(pen)
                painter.drawRect(self.cell_rect(layer, head).adjusted(-2, -2, 1, 1))
        painter.end()

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        cell = self.cell_at(event.position().toPoint())
        if cell is None:
            self.setToolTip("")
            self.unsetCursor()
        else:
            layer, head = cell
            name = self._names[layer] if layer < len(self._names) else ""
            label = self._labels[layer] if layer < len(self._labels) else f"L{layer}"
            self.setToolTip(f"{label} · head {head}\n{name}\nclick to open")
            self.setCursor(Qt.CursorShape.PointingHandCursor)
        super().mouseMoveEvent(event)

    def mousePressEvent(self, event: QMouseEvent) -> None:
        if event.button() == Qt.MouseButton.LeftButton:
            cell = self.cell_at(event.position().toPoint())
            if cell is not None:
                self.set_selected(*cell)
                self.cellClicked.emit(*cell)
                return
        super().mousePressEvent(event)

    def contextMenuEvent(self, event) -> None:
        cell = self.cell_at(event.pos())
        if cell is None:
            super().contextMenuEvent(event)
            return
        self.set_selected(*cell)
        self.cellContextMenu.emit(*cell, event.globalPos())

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and not self.toolTip():
            QToolTip.hideText()
            return True
        return super().event(event)


# --------------------------------------------------------------------------- panel


class AttentionPanel(QWidget):
    """Layer and head selectors, the big map with token labels, and the thumbnail grid."""

    stepRequested = Signal(int)
    """The user asked to jump to the step that computed the chosen layer's weights."""
    selectionChanged = Signal(int, int)
    """(layer, head) now shown in the big view."""
    headContextMenu = Signal(int, int, QPoint)
    """Right-click on a thumbnail: (step that computed the layer's map, head, position)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._trace: Trace | None = None
        self._paths: list[str] = []
        self._maps: list[torch.Tensor] = []
        self._steps: list[int | None] = []
        self._lookup: dict[str, int] = {}
        self._tokens: list[str] | None = None
        self._layer = 0
        self._labels: list[str] = []  # one per map, by module (layer_labels)
        self._head = 0
        self._batch = 0
        self._dirty = False  # big view needs a redraw when next shown
        self._grid_dirty = False  # thumbnails need building when next shown
        self._build_controls()
        self._build_maps()
        self._empty = QLabel()
        self._empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._empty.setWordWrap(True)
        self._empty.setMargin(24)
        column(
            self._controls,
            (self._splitter, 1),
            (self._empty, 1),
            margins=(0, 4, 0, 0),
            spacing=4,
            on=self,
        )
        self._set_empty("No trace loaded.")

    def _build_controls(self) -> None:
        """Layer [combo]  Head [spin]  Batch [spin]       [Go to step]"""
        self.layer_combo = QComboBox()
        self.layer_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.layer_combo.setMinimumContentsLength(12)
        self.layer_combo.currentIndexChanged.connect(self._on_layer_combo)
        self.head_spin = QSpinBox()
        self.head_spin.setMinimumWidth(56)
        self.head_spin.valueChanged.connect(self._on_head_spin)
        self.batch_spin = QSpinBox()
        self.batch_spin.setMinimumWidth(56)
        self.batch_spin.valueChanged.connect(self._on_batch_spin)
        self._batch_label = QLabel("Batch")
        self.goto_button = QToolButton()
        self.goto_button.setText("Go to step")
        self.goto_button.setToolTip("Jump the debugger to the step that computed these weights")
        self.goto_button.clicked.connect(self._request_current_step)

        controls = QHBoxLayout()
        controls.setContentsMargins(4, 0, 4, 0)
        controls.setSpacing(6)
        controls.addWidget(QLabel("Layer"))
        controls.addWidget(self.layer_combo, 1)
        controls.addWidget(QLabel("Head"))
        controls.addWidget(self.head_spin)
        controls.addWidget(self._batch_label)
        controls.addWidget(self.batch_spin)
        controls.addStretch(0)
        controls.addWidget(self.goto_button)
        self._controls = QWidget()
        self._controls.setLayout(controls)

    def _build_maps(self) -> None:
        """The big map and its caption over the grid of every layer's and head's thumbnail."""
        self.heatmap = HeatmapView(scale_key="attention")
        self.caption = ElidedLabel()
        self.caption.setObjectName("attentionCaption")
        self.caption.setForegroundRole(QPalette.ColorRole.PlaceholderText)

        big = column((self.heatmap, 1), self.caption, spacing=2)

        self.grid = AttentionGrid()
        self.grid.cellClicked.connect(self._on_cell_clicked)
        self.grid.cellContextMenu.connect(self._on_cell_context_menu)
        grid_title = QLabel("All layers × heads — click to open")
        bold = QFont(grid_title.font())
        bold.setBold(True)
        grid_title.setFont(bold)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(self.grid)
        grid_box = column(grid_title, (scroll, 1), margins=(4, 4, 4, 0), spacing=2)

        self._splitter = QSplitter(Qt.Orientation.Vertical)
        self._splitter.setChildrenCollapsible(False)
        self._splitter.addWidget(big)
        self._splitter.addWidget(grid_box)
        self._splitter.setStretchFactor(0, 3)
        self._splitter.setStretchFactor(1, 2)

    # ---- feeding

    def set_trace(self, trace: Trace | None, token_labels: list[str] | None = None) -> None:
        """Load the attention maps of ``trace`` (cheap: thumbnails are built on first show)."""
        self._trace, self._tokens = trace, token_labels
        maps = attention_maps(trace) if trace is not None else {}
        self._paths = list(maps)
        self._maps = [maps[p] for p in self._paths]
        self._steps = attention_steps(trace, self._paths) if trace is not None else []
        self._lookup = layer_lookup(trace, self._paths) if trace is not None else {}
        if trace is None:
            self._set_empty("No trace loaded.")
            return
        if not self._paths:
            self._set_empty(
                "This trace holds no attention maps: the model has no module whose "
                "attention weights the tracer could see."
            )
            return
        self._empty.hide()
        self._controls.show()
        self._splitter.show()

        self.layer_combo.blockSignals(True)
        self.layer_combo.clear()
        self._labels = layer_labels(self._paths)
        for i, path in enumerate(self._paths):
            self.layer_combo.addItem(f"{self._labels[i]} · {path}", i)
        self.layer_combo.blockSignals(False)
        batches = self._maps[0].shape[0]
        self.batch_spin.blockSignals(True)
        self.batch_spin.setRange(0, batches - 1)
        self.batch_spin.setValue(0)
        self.batch_spin.blockSignals(False)
        self._batch_label.setVisible(batches > 1)
        self.batch_spin.setVisible(batches > 1)
        self._layer, self._head, self._batch = 0, 0, 0
        self._grid_dirty = True
        self._sync_controls()
        self._changed()

    def _set_empty(self, text: str) -> None:
        self._paths, self._maps, self._steps = [], [], []
        self._labels = []
        self._controls.hide()
        self._splitter.hide()
        self._empty.setText(text)
        self._empty.show()

    # ---- state

    @property
    def paths(self) -> list[str]:
        """Attention module paths, one per layer, in the order they ran."""
        return list(self._paths)

    @property
    def layer(self) -> int:
        return self._layer

    @property
    def head(self) -> int:
        return self._head

    @property
    def batch(self) -> int:
        return self._batch

    def heads(self, layer: int | None = None) -> int:
        layer = self._layer if layer is None else layer
        return int(self._maps[layer].shape[1]) if self._maps else 0

    def current_map(self) -> torch.Tensor | None:
        """The ``(T, T)`` map of the chosen layer, head and batch element."""
        if not self._maps:
            return None
        return self._maps[self._layer][self._batch, self._head]

    def layer_for_step(self, step_index: int) -> int | None:
        """The layer whose attention the step belongs to, or None (an MLP step, the root)."""
        if self._trace is None or not 0 <= step_index < len(self._trace.steps):
            return None
        return self._lookup.get(self._trace.steps[step_index].module)

    def step_for_layer(self, layer: int) -> int | None:
        """The step that computed layer ``layer``'s attention weights."""
        return self._steps[layer] if 0 <= layer < len(self._steps) else None

    # ---- selection

    def set_layer(self, layer: int, head: int | None = None) -> None:
        """Show ``layer``; the head stays as it was unless given (clamped to the layer),
        and unless the map holds NaN or ±Inf only in other heads or batch elements: then
        the first of those opens."""
        if not self._maps:
            return
        layer = max(0, min(layer, len(self._maps) - 1))
        keep = head is None
        head = self._head if head is None else head
        head = max(0, min(head, self.heads(layer) - 1))
        jump = first_nonfinite_slice(self._maps[layer], (self._batch, head)) if keep else None
        if jump is not None:
            batch, head = jump
            if batch != self._batch:
                self.batch_spin.blockSignals(True)
                self.batch_spin.setValue(batch)
                self.batch_spin.blockSignals(False)
                self._batch, self._grid_dirty = batch, True
                self._layer = -1  # drawn afresh below
        if (layer, head) == (self._layer, self._head):
            return
        self._layer, self._head = layer, head
        self._sync_controls()
        self._changed()
        if self._grid_dirty and self.isVisible():  # another batch element's thumbnails
            self._build_grid()

    def set_head(self, head: int) -> None:
        self.set_layer(self._layer, head)

    def refresh(self) -> None:
        """Render now, visible or not (for exports and tests)."""
        self._build_grid()
        self._render()

    def _sync_controls(self) -> None:
        for widget in (self.layer_combo, self.head_spin):
            widget.blockSignals(True)
        self.layer_combo.setCurrentIndex(self._layer)
        self.head_spin.setRange(0, max(0, self.heads() - 1))
        self.head_spin.setValue(self._head)
        for widget in (self.layer_combo, self.head_spin):
            widget.blockSignals(False)
        self.grid.set_selected(self._layer, self._head)

    def _changed(self) -> None:
        self._dirty = True
        if self.isVisible():
            self._render()
        self.selectionChanged.emit(self._layer, self._head)

    def _on_layer_combo(self, index: int) -> None:
        if index >= 0:
            self.set_layer(index)

    def _on_head_spin(self, head: int) -> None:
        self.set_head(head)

    def _on_batch_spin(self, batch: int) -> None:
        self._batch = batch
        self._grid_dirty = True
        self._changed()
        if self.isVisible():
            self._build_grid()

    def _on_cell_clicked(self, layer: int, head: int) -> None:
        self.set_layer(layer, head)
        self._request_current_step()

    def _on_cell_context_menu(self, layer: int, head: int, where: QPoint) -> None:
        self.set_layer(layer, head)
        step = self.step_for_layer(layer)
        if step is not None:
            self.headContextMenu.emit(step, head, where)

    def _request_current_step(self) -> None:
        step = self.step_for_layer(self._layer)
        if step is not None:
            self.stepRequested.emit(step)

    # ---- drawing

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self._build_grid()
        if self._dirty:
            self._render()

    def _build_grid(self) -> None:
        if not self._grid_dirty:
            return
        self._grid_dirty = False
        first = not self.grid.shape[0]
        self.grid.set_images(thumbnail_images(self._maps, self._batch), self._paths, self._labels)
        self.grid.set_selected(self._layer, self._head)
        if first:  # give the grid the height it needs, up to 45 % of the panel
            total = sum(self._splitter.sizes())
            wanted = self.grid.minimumHeight() + 36
            grid_height = min(wanted, int(total * 0.45))
            self._splitter.setSizes([total - grid_height, grid_height])

    def _render(self) -> None:
        self._dirty = False
        a = self.current_map()
        if a is None:
            return
        labels = self._tokens if self._tokens and len(self._tokens) == a.shape[-1] else None
        self.heatmap.set_matrix(
            a,
            row_labels=labels,
            col_labels=labels,
            row_name="query",
            col_name="key",
            scale="probability",
            square=True,
        )
        peak = float(a.max()) if a.numel() else 0.0
        self.caption.setText(
            f"{self._labels[self._layer]} · head {self._head} · max {peak:.3g} — rows: queries "
            "attending "
            f"from, columns: keys attended to; each row sums to 1 · {self._paths[self._layer]}"
        )


__all__ = [
    "AttentionGrid",
    "AttentionPanel",
    "attention_maps",
    "attention_steps",
    "layer_lookup",
    "thumbnail_images",
]
