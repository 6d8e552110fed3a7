"""The compare window: two traces side by side, stepped together, coloured by divergence.

::

    ┌ Compare ─ A: before.trace  ◆  B: after.trace ───────────────────────────────────────┐
    │ A · before.trace            │ B · after.trace             │ FIRST DIVERGENCE         │
    │ ┌──────┐                    │ ┌──────┐                    │ blocks.1.ff.linear1 ·    │
    │ │ box  │◀ ring + badge      │ │ box  │                    │ linear  rel L2 3.1e-2    │
    │ └──────┘  coloured by       │ └──────┘                    │ THIS STEP  metrics table │
    │           divergence        │                             │ A − B heatmap            │
    ├─────────────────────────────┴─────────────────────────────┴──────────────────────────┤
    │ |◀ ◀ ▶ ▶▶ ▶|  ─────●──────────  entry 37 / 104 · blocks.1.self_attn · matmul · equal │
    └──────────────────────────────────────────────────────────────────────────────────────┘

The comparison itself is :func:`tracing.diff`: it aligns the two traces step by step
(by module, op, call and occurrence, so two prompts or two versions of a model line up)
and compares every aligned pair of outputs. This window only shows it:

- **Synchronised stepping** over the aligned entries: both diagrams highlight their side's
  step (a step that exists on one side only leaves the other side without a highlight).
  Clicking a box on either side jumps to its entry; expanding a box expands its partner.
- **Divergence colours**: every box gets a ring and a badge coloured by its divergence —
  module boxes by :meth:`TraceDiff.module_scores` (largest relative L2 of that module's
  outputs), op boxes by their own step. Green is identical, then yellow to red on a log
  scale up to a relative L2 of 1; magenta marks a changed shape or a step on one side only;
  grey means nothing could be compared (no values or statistics kept).
- **A − B** for the current step as a heatmap (a diverging map: dark is zero), with a
  slice bar for the leading axes, and the metrics of every output in a table.
- **First divergence**: the earliest step, in execution order, whose outputs differ — when
  one weight changed, the op that first used it. The window opens there.
- **Training steps** (``tracing.trace_step``): the step bar shows the forward and the
  backward phase; a backward entry reads ``∇ module · MmBackward0 ← matmul``, its outputs
  are gradients (``∇ output``) and A − B is the difference of the two gradients. "First
  divergent gradient" (G) jumps to the earliest backward step whose gradient differs.
"""

from __future__ import annotations

import html
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.core import session
from app.diagram.divergence import DivergenceOverlay, divergence_colour
from app.diagram.view import DiagramView
from app.panels.step_bar import StepBar
from app.widgets.common import column, hint_label, make_heading
from app.widgets.divergence_legend import DivergenceLegend
from app.widgets.heatmap import HeatmapView
from app.widgets.masked_cells import masked_cells
from app.widgets.slice_bar import SliceBar
from app.widgets.tensor_view import as_matrix, axis_names, leading_axes, token_labels
from app.windows import dialogs
from tracing.analysis.divergence import (
    STATUS_TEXT,
    entry_place,
    entry_score,
    gradient_scores,
    score_text,
    step_scores,
)
from tracing.analysis.trace_diff import StepDiff, TraceDiff
from tracing.analysis.trace_diff import diff as diff_traces
from tracing.dim_legend import dims_hover, letter_legend
from tracing.formatting import format_number, format_shape, step_number

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from tracing import Trace


# --------------------------------------------------------------------------- the window


def _card_title(text: str) -> QLabel:
    label = QLabel(text.upper())
    label.setObjectName("paneTitle")
    return label


class CompareWindow(QMainWindow):
    """Two traces side by side, stepped over their aligned steps.

    ``CompareWindow(trace_a, trace_b, name_a="before.trace", name_b="after.trace")``, or
    :meth:`from_files`; ``diff=`` shows a precomputed ``TraceDiff`` of the two (the rank
    view passes one restricted to what should agree). ``entryChanged(position)`` follows
    every move.
    """

    entryChanged = Signal(int)

    def __init__(
        self,
        trace_a: Trace,
        trace_b: Trace,
        name_a: str = "A",
        name_b: str = "B",
        *,
        atol: float = 0.0,
        diff: TraceDiff | None = None,
        parent: QWidget | None = None,
    ):
        super().__init__(parent)
        self.setObjectName("compareWindow")
        self.setWindowTitle(f"Compare {name_a} ◆ {name_b} — Scratchformer")
        self.resize(1600, 940)
        for trace in (trace_a, trace_b):  # before the diff reads their values
            dialogs.warn_on_unreadable_values(self, trace, owner=False)
        self.trace_a, self.trace_b = trace_a, trace_b
        self.name_a, self.name_b = name_a, name_b
        self.atol = atol
        # a given diff (the rank view's, restricted to what should agree) or a fresh one
        self.diff: TraceDiff = diff if diff is not None else diff_traces(trace_a, trace_b)
        self.entries: list[StepDiff] = list(self.diff.entries)
        self.divergent: list[StepDiff] = self.diff.divergent(atol)
        self.first: StepDiff | None = self.divergent[0] if self.divergent else None
        # training-step traces: where the backward entries start, and the first gradient
        # that differs (None for forward-only traces)
        self.backward_position: int | None = next(
            (i for i, e in enumerate(self.entries) if e.kind == "backward"), None
        )
        self.first_backward: StepDiff | None = next(
            (e for e in self.divergent if e.kind == "backward"), None
        )
        self._position_of = {id(e): i for i, e in enumerate(self.entries)}
        self.position = -1
        self.showing_gradients = False  # the rings: outputs (forward) or gradients
        self._syncing = False
        self._tokens_a = token_labels(trace_a)

        self._build_diagrams()
        self._build_right_panel()
        self._build_step_bar()
        self._build_layout()
        self._wire()
        self._actions()
        self._show_first()

    # --------------------------------------------------------------------- building

    def _build_diagrams(self) -> None:
        """A diagram per side, each with its divergence rings and badges."""
        self.diagram_a = DiagramView(self)
        self.diagram_b = DiagramView(self)
        self.overlay_a = DivergenceOverlay(
            self.diagram_a, step_scores(self.diff, self.trace_a, "a")
        )
        self.overlay_b = DivergenceOverlay(
            self.diagram_b, step_scores(self.diff, self.trace_b, "b")
        )

    def _build_right_panel(self) -> None:
        """First divergence, this step, A − B: the panel right of the diagrams."""
        buttons = self._build_summary()
        self._build_step_card()
        self._build_tabs()
        self.right_panel = right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(8, 6, 8, 6)
        right_layout.setSpacing(6)
        self.right_layout = right_layout  # add_card inserts above the first card
        right_layout.addWidget(_card_title("First divergence"))
        right_layout.addWidget(self.summary)
        right_layout.addLayout(buttons)
        right_layout.addWidget(_separator())
        right_layout.addWidget(_card_title("This step"))
        right_layout.addWidget(self.step_title)
        right_layout.addWidget(self.metrics)
        right_layout.addWidget(self.tabs, 1)

    def _build_summary(self) -> QHBoxLayout:
        """The first divergence in words, and the buttons that jump between divergences."""
        self.summary = QLabel()
        self.summary.setObjectName("compareSummary")
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.RichText)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.first_button = QPushButton("Go to first divergence")
        self.first_button.setObjectName("goToFirstDivergence")
        self.first_button.clicked.connect(self.go_to_first_divergence)
        self.next_div_button = QPushButton("Next divergence ▶")
        self.next_div_button.setObjectName("nextDivergence")
        self.next_div_button.setToolTip("The next aligned step whose outputs differ (D)")
        self.next_div_button.clicked.connect(self.next_divergence)
        self.first_backward_button = QPushButton("First divergent gradient")
        self.first_backward_button.setObjectName("goToFirstGradientDivergence")
        self.first_backward_button.setToolTip(
            "The earliest backward step whose gradient differs (G)"
        )
        self.first_backward_button.clicked.connect(self.go_to_first_backward_divergence)
        buttons = QHBoxLayout()
        buttons.addWidget(self.first_button)
        buttons.addWidget(self.next_div_button)
        buttons.addWidget(self.first_backward_button)
        buttons.addStretch(1)
        return buttons

    def _build_step_card(self) -> None:
        """This step's title and the metrics of each of its outputs."""
        self.step_title = QLabel(" ")
        self.step_title.setObjectName("compareStepTitle")
        self.step_title.setTextFormat(Qt.TextFormat.RichText)
        self.step_title.setWordWrap(True)
        self.metrics = QTableWidget(0, 6)
        self.metrics.setObjectName("compareMetrics")
        self.metrics.setHorizontalHeaderLabels(
            ["output", "shape A", "shape B", "max |A−B|", "rel L2", "cosine"]
        )
        self.metrics.verticalHeader().hide()
        self.metrics.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.metrics.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.metrics.setShowGrid(False)
        self.metrics.setAlternatingRowColors(True)
        header = self.metrics.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.metrics.verticalHeader().setDefaultSectionSize(self.metrics.fontMetrics().height() + 8)
        self.metrics.setFixedHeight(3 * (self.metrics.fontMetrics().height() + 8) + 30)

    def _build_tabs(self) -> None:
        """A − B and the list of divergent steps, as tabs."""
        self.divergent_list = QListWidget()
        self.divergent_list.setObjectName("divergentSteps")
        self.divergent_list.setUniformItemSizes(True)
        self.divergent_list.itemActivated.connect(self._on_divergent_item)
        self.divergent_list.itemClicked.connect(self._on_divergent_item)
        self._fill_divergent_list()

        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self._build_difference_page(), "A − B")
        self.tabs.addTab(self.divergent_list, f"Divergent steps ({len(self.divergent)})")

    def _build_difference_page(self) -> QWidget:
        """A − B as a heatmap, with a slice bar for the leading axes."""
        self.slice_bar = SliceBar()
        self.slice_bar.changed.connect(self._render_difference)
        self.difference_heatmap = HeatmapView()
        self.difference_heatmap.setObjectName("differenceHeatmap")
        self.difference_caption = hint_label()
        diff_page = QWidget()
        diff_layout = QVBoxLayout(diff_page)
        diff_layout.setContentsMargins(4, 6, 4, 4)
        diff_layout.setSpacing(4)
        diff_layout.addWidget(self.slice_bar)
        diff_layout.addWidget(self.difference_heatmap, 1)
        diff_layout.addWidget(self.difference_caption)
        return diff_page

    def _build_step_bar(self) -> None:
        """The step bar over the aligned entries (reused; the module-stepping buttons
        hidden), with the colour legend beside it."""
        self.step_bar = StepBar(self)
        for b in (self.step_bar.over_button, self.step_bar.out_button, self.step_bar.nan_button):
            b.hide()
        self.step_bar.stepRequested.connect(self.go_to)
        self.legend = DivergenceLegend()
        self.bottom_bar = bottom = QWidget()
        bottom.setObjectName("stepBar")
        bottom_layout = QHBoxLayout(bottom)
        bottom_layout.setContentsMargins(0, 0, 8, 0)
        bottom_layout.addWidget(self.step_bar, 1)
        bottom_layout.addWidget(self.legend, 0, Qt.AlignmentFlag.AlignVCenter)

    def _build_layout(self) -> None:
        """Side A, side B and the right panel in a splitter, the step bar below."""
        side_a = self._side_pane("A", self.name_a, self.trace_a, self.diagram_a)
        side_b = self._side_pane("B", self.name_b, self.trace_b, self.diagram_b)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(side_a)
        self.splitter.addWidget(side_b)
        self.splitter.addWidget(self.right_panel)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setHandleWidth(5)
        self.splitter.setSizes([560, 560, 480])
        self.setCentralWidget(column((self.splitter, 1), self.bottom_bar, spacing=0))
        self.counts_label = QLabel(self._counts_text())
        self.statusBar().addWidget(self.counts_label, 1)

    def _wire(self) -> None:
        """Clicks and expansions on either diagram move both sides."""
        self.diagram_a.stepActivated.connect(lambda i: self.go_to_step("a", i))
        self.diagram_b.stepActivated.connect(lambda i: self.go_to_step("b", i))
        self.diagram_a.layoutChanged.connect(lambda: self._sync_expansion("a"))
        self.diagram_b.layoutChanged.connect(lambda: self._sync_expansion("b"))

    def _show_first(self) -> None:
        """Both traces drawn, the summary filled, and the first divergence on show."""
        self.diagram_a.set_trace(self.trace_a)
        self.diagram_b.set_trace(self.trace_b)
        self.overlay_a.apply()
        self.overlay_b.apply()
        self._fill_summary()
        self.step_bar.set_count(len(self.entries))
        self.step_bar.set_phases(self.backward_position, len(self.entries))
        start = self._position_of[id(self.first)] if self.first is not None else 0
        if self.entries:
            self.go_to(start, reveal=self.first is not None)

    def add_card(self, title: str, widget: QWidget) -> None:
        """Put a titled card at the top of the right panel (the edit view's prediction)."""
        self.right_layout.insertWidget(0, _separator())
        self.right_layout.insertWidget(0, widget)
        self.right_layout.insertWidget(0, _card_title(title))

    @classmethod
    def from_files(cls, path_a: str | Path, path_b: str | Path, **kwargs) -> CompareWindow:
        """Open two trace files (``app.core.session.SessionError`` names a bad one)."""
        a = session.open_trace(path_a)
        b = session.open_trace(path_b)
        return cls(a, b, Path(path_a).name, Path(path_b).name, **kwargs)

    def _side_pane(self, side: str, name: str, trace: Trace, view: DiagramView) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(6, 6, 0, 0)
        layout.setSpacing(2)
        title = QLabel(
            f"<b style='color:{theme.CURRENT}'>{side}</b>&nbsp;&nbsp;{html.escape(name)}"
        )
        title.setObjectName("compareSideTitle")
        title.setTextFormat(Qt.TextFormat.RichText)
        make_heading(title, bold=False)
        meta = trace.meta
        parts = [str(meta.get("model_class", "model")).rsplit(".", 1)[-1]]
        if isinstance(meta.get("text"), str) and meta["text"]:
            parts.append(f"“{meta['text']}”")
        if meta.get("capture"):
            parts.append(f"capture {meta['capture']}")
        parts.append(f"{len(trace.steps)} steps")
        sub = hint_label(" · ".join(parts))
        layout.addWidget(title)
        layout.addWidget(sub)
        layout.addWidget(view, 1)
        return box

    def _actions(self) -> None:
        def action(text: str, keys: list[str], slot) -> QAction:
            a = QAction(text, self)
            a.setShortcuts([QKeySequence(k) for k in keys])
            a.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
            a.triggered.connect(lambda _checked=False: slot())
            self.addAction(a)
            return a

        self.next_action = action("Next aligned step", ["Right", "F11"], self.next)
        self.prev_action = action("Previous aligned step", ["Left", "F7"], self.prev)
        self.first_step_action = action("First step", ["Home"], lambda: self.go_to(0))
        self.last_step_action = action(
            "Last step", ["End"], lambda: self.go_to(len(self.entries) - 1)
        )
        self.next_div_action = action("Next divergence", ["D"], self.next_divergence)
        self.prev_div_action = action("Previous divergence", ["Shift+D"], self.prev_divergence)
        self.first_backward_action = action(
            "First divergent gradient", ["G"], self.go_to_first_backward_divergence
        )
        self.fit_action = action("Fit both diagrams", ["F"], self.fit)
        self.close_action = action("Close", ["Ctrl+W", "Escape"], self.close)

    # --------------------------------------------------------------------- moving

    @property
    def current_entry(self) -> StepDiff | None:
        return self.entries[self.position] if 0 <= self.position < len(self.entries) else None

    def go_to(self, position: int, reveal: bool = False) -> None:
        """Move both sides to aligned entry ``position`` (clamped); a jump (``reveal``)
        opens both diagrams down to the step and keeps it in view on both sides."""
        if not self.entries:
            return
        position = max(0, min(int(position), len(self.entries) - 1))
        e = self.entries[position]
        a = e.a_index if e.a_index is not None else -1
        b = e.b_index if e.b_index is not None else -1
        if reveal:
            self.diagram_a.reveal(a)
            self.diagram_b.reveal(b)  # (each reveal may sync the other side's boxes)
        if position == self.position:
            if reveal:
                self.diagram_a.set_current(a)
                self.diagram_b.set_current(b)
            return
        self.position = position
        self.diagram_a.set_current(a)
        self.diagram_b.set_current(b)
        step = self._step_of(e)
        source = ""
        if step is not None and step.source is not None:
            source = f"{Path(step.source.file).name}:{step.source.line} · {step.source.text}"
        status = f"{position + 1} / {len(self.entries)} · {self.entry_label(e)}"
        self.step_bar.set_position(position, status, source)
        self.step_bar.status.set_colour(theme.CURRENT if e.differs(self.atol) else theme.TEXT)
        self._show_phase(e.kind == "backward")
        self._show_entry(e)
        self.entryChanged.emit(position)

    def go_to_step(self, side: str, index: int) -> None:
        """Jump to the entry holding step ``index`` of side ``"a"`` or ``"b"``."""
        entry = self.diff.for_step_a(index) if side == "a" else self.diff.for_step_b(index)
        if entry is not None:
            self.go_to(self._position_of[id(entry)], reveal=True)

    def next(self) -> None:
        self.go_to(self.position + 1)

    def prev(self) -> None:
        self.go_to(self.position - 1)

    def go_to_first_divergence(self) -> None:
        if self.first is not None:
            self.go_to(self._position_of[id(self.first)], reveal=True)

    def _show_phase(self, backward: bool) -> None:
        """The rings say how the outputs differ in the forward phase, how the gradients
        differ in the backward phase (each box: the worst gradient that reached it)."""
        if backward == self.showing_gradients:
            return
        self.showing_gradients = backward
        for overlay, trace, side in ((self.overlay_a, self.trace_a, "a"),
                                     (self.overlay_b, self.trace_b, "b")):  # fmt: skip
            overlay.clear()
            if backward:
                overlay.scores = gradient_scores(self.diff, trace, side)
            else:
                overlay.scores = step_scores(self.diff, trace, side)
            overlay.apply()
        self.legend.title = self.legend.GRADIENT_TITLE if backward else self.legend.TITLE
        self.legend.update()

    def go_to_first_backward_divergence(self) -> None:
        """Jump to the earliest backward step whose gradient differs."""
        if self.first_backward is not None:
            self.go_to(self._position_of[id(self.first_backward)], reveal=True)
        elif self.backward_position is not None:
            self.statusBar().showMessage("No gradient differs.", 3000)

    def entry_label(self, e: StepDiff) -> str:
        """``blocks.1 · linear``; a backward entry ``∇ blocks.1 · MmBackward0 ← linear``."""
        if e.kind != "backward":
            return e.label
        trace = self.trace_a if e.a_index is not None else self.trace_b
        step = self._step_of(e)
        arrow = f" ← {trace.steps[step.forward].op}" if step.forward is not None else ""
        return f"∇ {e.label}{arrow}"

    def _output_name(self, e: StepDiff, row: int, name: str) -> str:
        """A backward step's output is a gradient: ``∇ output`` (the forward tensor's name
        at its step) or ``∇ blocks.0.fc.weight`` for a parameter's."""
        if e.kind != "backward":
            return name
        trace = self.trace_a if e.a_index is not None else self.trace_b
        step = self._step_of(e)
        if row >= len(step.outputs):
            return f"∇ {name}"
        of = trace.tensors[step.outputs[row]].grad_of
        if step.op == "AccumulateGrad":
            params = {rid: p for p, rid in trace.meta.get("param_grads", {}).items()}
            return f"∇ {params.get(step.outputs[row], name)}"
        fwd = trace.steps[step.forward] if step.forward is not None else None
        if of is not None and fwd is not None and of in fwd.outputs:
            return f"∇ {fwd.output_names[fwd.outputs.index(of)]}"
        return f"∇ {name}"

    def next_divergence(self) -> None:
        for i in range(self.position + 1, len(self.entries)):
            if self.entries[i].differs(self.atol):
                self.go_to(i, reveal=True)
                return
        self.statusBar().showMessage("No divergent step after this one.", 3000)

    def prev_divergence(self) -> None:
        for i in range(self.position - 1, -1, -1):
            if self.entries[i].differs(self.atol):
                self.go_to(i, reveal=True)
                return

    def fit(self) -> None:
        self.diagram_a.fit()
        self.diagram_b.fit()

    def box_score(self, side: str, step_index: int) -> tuple[float | None, str | None]:
        """The (score, status) that colours the box of ``step_index`` on one side."""
        overlay = self.overlay_a if side == "a" else self.overlay_b
        return overlay.scores.get(step_index, (None, None))

    # --------------------------------------------------------------------- showing

    def _step_of(self, e: StepDiff):
        if e.a_index is not None:
            return self.trace_a.steps[e.a_index]
        return self.trace_b.steps[e.b_index]

    def _show_entry(self, e: StepDiff) -> None:
        colour = divergence_colour(entry_score(e)).name()
        self.step_title.setText(
            f"<b>{html.escape(self.entry_label(e))}</b> · {entry_place(e)}<br>"
            f"<span style='color:{colour}'>● {STATUS_TEXT.get(e.status, e.status)}</span>"
        )
        self.metrics.setRowCount(len(e.outputs))
        for row, o in enumerate(e.outputs):
            record_a = self._output_record(self.trace_a, e.a_index, row, o.shape_a)
            record_b = self._output_record(self.trace_b, e.b_index, row, o.shape_b)
            cells = [
                self._output_name(e, row, o.name),
                format_shape(o.shape_a, record_a.dims if record_a else None),
                format_shape(o.shape_b, record_b.dims if record_b else None),
                format_number(o.max_abs, 3),
                format_number(o.rel_l2, 3)
                if o.rel_l2 is not None
                else (
                    f"Δstats {format_number(o.stats_delta, 3)}"
                    if o.stats_delta is not None
                    else "–"
                ),
                format_number(o.cosine, 6),
            ]
            hovers = {1: (record_a, self.trace_a), 2: (record_b, self.trace_b)}
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                record, trace = hovers.get(col, (None, None))
                if record is not None:  # each letter's size, meaning and origin in that trace
                    legend = letter_legend(trace.meta)
                    item.setToolTip(dims_hover(record.shape, record.dims, legend, record.why))
                if col == 4 and o.differs(self.atol):
                    item.setForeground(
                        divergence_colour(o.rel_l2 if not o.shape_changed else math.inf)
                    )
                self.metrics.setItem(row, col, item)
        self._prepare_difference(e)

    @staticmethod
    def _output_record(trace, step_index: int | None, row: int, shape):
        """The record of output ``row`` of a step on one side, when it is the one compared."""
        if step_index is None or shape is None:
            return None
        outputs = trace.steps[step_index].outputs
        if row >= len(outputs):
            return None
        record = trace.tensors[outputs[row]]
        return record if tuple(record.shape) == tuple(shape) else None

    def _prepare_difference(self, e: StepDiff) -> None:
        self._difference: torch.Tensor | None = None
        self._difference_record = None
        if e.one_sided:
            side = "A" if e.status == "only_a" else "B"
            self._no_difference(f"This step exists in {side} only: nothing to subtract.")
            return
        if not e.outputs:
            self._no_difference("This step has no outputs.")
            return
        if e.status == "sharded":  # the rank view: each side holds its own shard
            self._no_difference(
                "Each rank holds its own shard here: they differ by design. The whole "
                "tensor is in the Stitched tab."
            )
            return
        o = e.outputs[0]
        if o.shape_changed:
            self._no_difference(
                f"The output's shape changed: {format_shape(o.shape_a)} in A, "
                f"{format_shape(o.shape_b)} in B. Values of different shapes cannot be subtracted."
            )
            return
        value = self.diff.difference(e)
        if value is None:
            capture = self.trace_a.meta.get("capture"), self.trace_b.meta.get("capture")
            why = (
                "A trace kept no values (capture " + " / ".join(str(c) for c in capture) + ")."
                if "values" not in capture or capture[0] != capture[1]
                else "No values were kept for this tensor (over the capture's size cap)."
            )
            delta = (
                f" The statistics differ by up to {format_number(o.stats_delta, 3)}."
                if o.stats_delta
                else ""
            )
            self._no_difference(f"<b>No A − B heatmap.</b><br>{why}{delta}")
            return
        self._difference = value
        self._difference_sides = (
            self.trace_a.value(self.trace_a.steps[e.a_index].outputs[0]),
            self.trace_b.value(self.trace_b.steps[e.b_index].outputs[0]),
        )
        record = self.trace_a.tensors[self.trace_a.steps[e.a_index].outputs[0]]
        self._difference_record = replace(record, role=None)
        if value.dim() == 0:
            self.slice_bar.set_axes([])
            self.difference_heatmap.show_message(
                f"<p style='font-size:15pt'>{float(value):.6g}</p><p>A − B (a scalar)</p>"
            )
            self.difference_caption.setText(" ")
            return
        self.slice_bar.set_axes(leading_axes(self._difference_record))
        self._render_difference()

    def _fills_of_a_or_b(self) -> np.ndarray | None:
        """Cells that are mask fills (-1e9, -inf) in A or in B: A − B there is no data."""
        found = None
        for side in getattr(self, "_difference_sides", ()):
            if side is None or side.shape != self._difference.shape:
                continue
            cells = masked_cells(as_matrix(side, self.slice_bar.index()).float().numpy())
            if cells is not None:
                found = cells.where if found is None else (found | cells.where)
        return found

    def _render_difference(self) -> None:
        value, record = self._difference, self._difference_record
        if value is None or record is None or value.dim() == 0:
            return
        names = axis_names(record)
        matrix = as_matrix(value, self.slice_bar.index())
        row_name, col_name = ("", names[0]) if value.dim() == 1 else (names[-2], names[-1])
        tokens = self._tokens_a
        rows, cols = matrix.shape
        self.difference_heatmap.set_matrix(
            matrix,
            row_labels=tokens if tokens and row_name == "T" and len(tokens) == rows else None,
            col_labels=tokens if tokens and col_name == "T" and len(tokens) == cols else None,
            row_name=row_name or " ",
            col_name=col_name,
            scale="signed",
            masked=self._fills_of_a_or_b(),
        )
        cut = ", ".join(
            f"{n}={i}" for (n, _), i in zip(leading_axes(record), self.slice_bar.index())
        )
        biggest = float(value.abs().max()) if value.numel() else 0.0
        self.slice_bar.description.setText(
            (f"[{cut}] → " if cut else "") + f"{row_name or 'row'} × {col_name}"
        )
        self.difference_caption.setText(
            "A − B · identical here (every element equal)"
            if biggest == 0
            else f"A − B · max |A − B| = {format_number(biggest, 3)} over the whole tensor"
        )

    def _no_difference(self, text: str) -> None:
        self.slice_bar.set_axes([])
        self.slice_bar.description.setText(" ")
        self.difference_heatmap.show_message(text)
        self.difference_caption.setText(" ")

    def _fill_summary(self) -> None:
        c = self.diff.counts()
        first = self.first
        self.first_backward_button.setVisible(self.backward_position is not None)
        self.first_backward_button.setEnabled(self.first_backward is not None)
        if first is None:
            self.summary.setText(
                f"<span style='color:{theme.IDENTICAL}; font-size:12pt'><b>● No divergence</b>"
                f"</span><br>The traces agree at all {len(self.entries)} aligned steps"
                + (f" (atol {self.atol:g})." if self.atol else ".")
            )
            self.first_button.setEnabled(False)
            self.next_div_button.setEnabled(False)
            return
        step = self._step_of(first)
        colour = divergence_colour(entry_score(first)).name()
        lines = [
            f"<span style='color:{colour}; font-size:12pt'><b>● {html.escape(first.label)}"
            f"</b></span>",
            f"{entry_place(first)} · {STATUS_TEXT.get(first.status, first.status)}",
        ]
        if first.rel_l2 is not None:
            lines.append(
                f"rel L2 <b>{format_number(first.rel_l2, 3)}</b> · "
                f"max |A−B| <b>{format_number(first.max_abs, 3)}</b> · "
                f"cosine {format_number(first.cosine, 6)}"
            )
        if step.source is not None and step.source.text:
            lines.append(
                f"<code style='color:{theme.TEXT_SHAPE}'>"
                f"{html.escape(Path(step.source.file).name)}:{step.source.line}  "
                f"{html.escape(step.source.text)}</code>"
            )
        grad = self.first_backward
        if grad is not None:
            grad_colour = divergence_colour(entry_score(grad)).name()
            lines.append(
                f"First divergent gradient: <span style='color:{grad_colour}'>"
                f"<b>{html.escape(self.entry_label(grad))}</b></span> · {entry_place(grad)}"
                + (f" · rel L2 {format_number(grad.rel_l2, 3)}" if grad.rel_l2 is not None else "")
            )
        lines.append(
            f"<span style='color:{theme.TEXT_MUTED}'>"
            f"{len(self.divergent)} of {len(self.entries)} aligned "
            f"steps differ · {c['shape']} changed shape · {c['only_a']} only in A · "
            f"{c['only_b']} only in B</span>"
        )
        self.summary.setText("<br>".join(lines))

    def _fill_divergent_list(self) -> None:
        self.divergent_list.clear()
        for e in self.divergent[:2000]:
            a, b = e.a_index, e.b_index
            where = f"A{step_number(a)}" if a is not None else f"B{step_number(b)}"
            score = entry_score(e)
            item = QListWidgetItem(f"{where:>6}  {e.label}   {score_text(score, e.status)}")
            item.setForeground(divergence_colour(score))
            item.setData(Qt.ItemDataRole.UserRole, self._position_of[id(e)])
            self.divergent_list.addItem(item)
        if not self.divergent:
            item = QListWidgetItem("No step differs.")
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            self.divergent_list.addItem(item)

    def _on_divergent_item(self, item: QListWidgetItem) -> None:
        position = item.data(Qt.ItemDataRole.UserRole)
        if position is not None:
            self.go_to(int(position), reveal=True)

    def _counts_text(self) -> str:
        c = self.diff.counts()
        return (
            f"{len(self.entries)} aligned entries · {c['equal']} equal · {c['changed']} values "
            f"differ · {c['shape']} shape changed · {c['only_a']} only in A · "
            f"{c['only_b']} only in B"
        )

    # --------------------------------------------------------------------- expansion sync

    def _sync_expansion(self, source: str) -> None:
        """Expanding a box on one side expands its partner on the other."""
        if self._syncing:
            return
        src, dst = (
            (self.diagram_a, self.diagram_b) if source == "a" else (self.diagram_b, self.diagram_a)
        )
        lookup = self.diff.for_step_a if source == "a" else self.diff.for_step_b
        partner = {}
        for key in src.expanded:
            entry = lookup(key)
            other = None if entry is None else (entry.b_index if source == "a" else entry.a_index)
            if other is not None:
                partner[key] = other
        wanted = set(partner.values())
        if wanted == dst.expanded:
            return
        self._syncing = True
        try:
            dst.set_expanded(wanted)
        finally:
            self._syncing = False


def _separator() -> QFrame:
    line = QFrame()
    line.setFrameShape(QFrame.Shape.HLine)
    line.setStyleSheet(f"color: {theme.DIVIDER};")
    return line


def open_compare(
    trace_a: Trace, trace_b: Trace, name_a: str = "A", name_b: str = "B", parent=None
) -> CompareWindow:
    """Build and show a compare window (kept alive by its parent, or by the caller)."""
    window = CompareWindow(trace_a, trace_b, name_a, name_b, parent=parent)
    dialogs.show_child_window(window, parent)
    return window


__all__ = ["CompareLauncher", "CompareWindow", "attach", "open_compare"]


# --------------------------------------------------------------------------- main window


class CompareLauncher(dialogs.FileMenuLauncher):
    """File ▸ Compare with…: the window's trace against a trace file, in a CompareWindow."""

    def __init__(self, window):
        super().__init__(
            window,
            "&Compare with…",
            "Open a second trace and compare it step by step with this one",
            after=window.save_action,
            shortcut="Ctrl+Shift+C",
        )
        window.traceChanged.connect(self._update_enabled)
        self._update_enabled()

    def _update_enabled(self) -> None:
        trace = self.window.trace
        self.action.setEnabled(trace is not None and bool(trace.steps))

    def open_dialog(self) -> None:
        for path in self.ask_for_files("Compare with trace"):
            self.open_with(path)

    def open_with(self, path: str | Path) -> CompareWindow | None:
        """Compare the window's trace (A) with the trace file at ``path`` (B)."""
        trace = self.window.trace
        if trace is None:
            return None
        try:
            other = session.open_trace(path)
        except session.SessionError as e:
            dialogs.show_error(self.window, "Cannot compare", str(e))
            return None
        name_a = self.window.trace_path.name if self.window.trace_path else "current trace"
        return self.show_pair(trace, other, name_a, Path(path).name)

    def show_pair(self, trace_a, trace_b, name_a: str, name_b: str) -> CompareWindow | None:
        """A CompareWindow of two traces in memory, owned by the main window."""
        try:
            compare = CompareWindow(trace_a, trace_b, name_a, name_b, parent=self.window)
        except Exception as e:  # two traces the diff cannot align: say so, keep going
            dialogs.show_error(self.window, "Cannot compare", f"{type(e).__name__}: {e}")
            return None
        dialogs.show_child_window(compare, self.window, self.windows)
        return compare


def attach(window) -> CompareLauncher:
    """Add File ▸ Compare with… (Ctrl+Shift+C) to the main window."""
    return CompareLauncher(window)
