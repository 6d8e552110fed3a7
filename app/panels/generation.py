"""The generation view: a token timeline over a traced ``generate()`` call.

::

    ┌ Generation · “ab|” → “ba.” · 3 passes ───────────────────────┐
    │  a  b  |  → [b]  a  .                                        │  prompt chips muted;
    │               ▆▆   ▆  ▆                                      │  a bar under each new
    │  ◀ Prev pass  Next pass ▶  pass 1 / 3 · saw 3 tokens · ...   │  token: its probability
    ├──────────────────────────────────────────────────────────────┤
    │  Layer [blocks.1 ▾] Head [2]   this pass's attention (T × T) │  grows one row and one
    └──────────────────────────────────────────────────────────────┘  column per pass

Autoregressive generation runs one forward pass per new token over the whole sequence so
far (:func:`tracing.generation.trace_generate`). Selecting a token selects the pass that
chose it: the view emits :attr:`GenerationView.passSelected` and the main window loads
that pass's ``Trace``, at the same step index, so a person steps *within* a pass with the
usual controls and *across* passes here, and watches the heatmaps grow with the sequence.

:func:`app.core.generation_session.run_generation` does the work without Qt (build the model,
encode, trace every pass, report progress, honour a cancel flag);
:class:`app.workers.GenerationJob` runs it off the GUI thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, QObject, QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QAction,
    QColor,
    QFont,
    QFontMetrics,
    QKeyEvent,
    QKeySequence,
    QMouseEvent,
    QPainter,
    QPen,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDockWidget,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPlainTextEdit,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QStyle,
    QTableWidget,
    QTableWidgetItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

import tracing
from app import theme
from app.core.generation_session import MAX_NEW_TOKENS, GenerationOutcome, GenerationRequest
from app.core.session import DEFAULT_CAPTURE, ModelSource
from app.widgets.common import column, hint_label, make_heading, monospace_font
from app.widgets.heatmap import HeatmapView
from app.widgets.tensor_view import token_label
from app.windows import dialogs
from app.windows.dialogs import lay_out_form
from app.workers import GenerationJob
from tracing.token_names import token_namer

if TYPE_CHECKING:  # pragma: no cover
    from tracing import Trace
    from tracing.runs.generation import GenerationTrace


class TraceGenerationDialog(QDialog):
    """Prompt, number of new tokens and capture level for "Trace generation…"."""

    def __init__(self, parent: QWidget | None = None, prompt: str = "", source_text: str = ""):
        super().__init__(parent)
        self.setWindowTitle("Trace generation")
        self.setMinimumWidth(480)
        self.prompt_edit = QPlainTextEdit(self)
        self.prompt_edit.setPlaceholderText("Text the model continues…")
        self.prompt_edit.setPlainText(prompt)
        self.prompt_edit.setFixedHeight(70)
        self.tokens_spin = QSpinBox(self)
        self.tokens_spin.setRange(1, MAX_NEW_TOKENS)
        self.tokens_spin.setValue(8)
        self.tokens_spin.setSuffix(" new tokens")
        self.capture_combo = QComboBox(self)
        self.capture_combo.addItems(tracing.CAPTURE_LEVELS)
        self.capture_combo.setCurrentText(DEFAULT_CAPTURE)
        hint = hint_label(
            "One traced forward pass per new token (greedy: the most likely token). "
            f"Model: {source_text or 'the bundled demo'}.",
            wrap=True,
        )
        lay_out_form(
            self,
            [
                ("Prompt", self.prompt_edit),
                ("Generate", self.tokens_spin),
                ("Capture", self.capture_combo),
                ("", hint),
            ],
            ok_text="Trace",
        )

    def request(self, source: ModelSource | None = None) -> GenerationRequest:
        return GenerationRequest(
            prompt=self.prompt_edit.toPlainText(),
            max_new_tokens=self.tokens_spin.value(),
            source=source or ModelSource("demo"),
            capture=self.capture_combo.currentText(),
        )


# --------------------------------------------------------------------------- timeline

CHIP_H = 30
BAR_H = 5
CHIP_GAP = 3


class TokenTimeline(QWidget):
    """The sequence as chips: prompt tokens muted, then one chip per generated token.

    A generated chip carries a bar as wide as the probability its pass gave it. Click a
    chip (or Left / Right) to select its pass; ``passClicked(n)`` says which.
    """

    passClicked = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("tokenTimeline")
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setMouseTracking(True)
        self.prompt: list[int] = []
        self.name: Callable[[int], str] = token_label  # id -> text (the trace's tokenizer)
        self.tokens: list[int] = []
        self.probs: list[float | None] = []
        self.selected = -1
        self._rects: list[QRectF] = []  # one per chip, prompt first
        font = monospace_font()
        font.setPointSizeF(font.pointSizeF() + 1)
        self.setFont(font)
        self._small = QFont(self.font())
        self._small.setPointSizeF(max(6.5, self.font().pointSizeF() - 3))
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(CHIP_H + BAR_H + 34)

    def set_sequence(self, prompt: list[int], tokens: list[int], probs: list[float | None]) -> None:
        self.prompt, self.tokens, self.probs = list(prompt), list(tokens), list(probs)
        self.selected = -1
        self._layout_chips()
        self.update()

    def set_selected(self, n: int) -> None:
        if n != self.selected:
            self.selected = n
            self.update()
            if 0 <= n < len(self.tokens):
                rect = self._rects[len(self.prompt) + n]
                self._ensure_visible(rect)

    def chip_rect(self, pass_index: int) -> QRectF:
        """Where the chip of generated token ``pass_index`` is drawn (widget coordinates)."""
        return self._rects[len(self.prompt) + pass_index]

    def pass_at(self, x: float, y: float) -> int | None:
        for i, rect in enumerate(self._rects):
            if rect.adjusted(-CHIP_GAP / 2, 0, CHIP_GAP / 2, BAR_H + 6).contains(x, y):
                n = i - len(self.prompt)
                return n if n >= 0 else None
        return None

    def _layout_chips(self) -> None:
        metrics = QFontMetrics(self.font())
        x = 8.0
        self._rects = []
        for token in [*self.prompt, *self.tokens]:
            w = max(22.0, metrics.horizontalAdvance(self.name(token)) + 12.0)
            self._rects.append(QRectF(x, 8, w, CHIP_H))
            x += w + CHIP_GAP
            if len(self._rects) == len(self.prompt):
                x += 14  # a gap between prompt and answer, where the arrow goes
        self.setMinimumWidth(int(x + 8))

    def sizeHint(self) -> QSize:
        return QSize(self.minimumWidth(), self.height())

    def _ensure_visible(self, rect: QRectF) -> None:
        scroll = self.parent().parent() if self.parent() is not None else None
        if isinstance(scroll, QScrollArea):
            scroll.ensureVisible(int(rect.center().x()), int(rect.center().y()), 60, 0)

    # ---- Qt virtuals

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        n_prompt = len(self.prompt)
        labels = [self.name(t) for t in [*self.prompt, *self.tokens]]
        # the diagram's colours, so a chip looks like a box there; prompt chips sit back a shade
        for i, (rect, label) in enumerate(zip(self._rects, labels)):
            generated = i >= n_prompt
            n = i - n_prompt
            selected = generated and n == self.selected
            if selected:
                glow = QColor(theme.CURRENT)
                glow.setAlpha(60)
                painter.setPen(QPen(glow, 6))
                painter.setBrush(Qt.BrushStyle.NoBrush)
                painter.drawRoundedRect(rect, 6, 6)
            border = theme.CURRENT if selected else theme.BOX_BORDER
            painter.setPen(QPen(QColor(border), 2 if selected else 1))
            fill = theme.BOX_FILL if generated else theme.ALTERNATE_BASE
            painter.setBrush(QColor(theme.CURRENT_FILL if selected else fill))
            if not generated:
                painter.setPen(Qt.PenStyle.NoPen)
            painter.drawRoundedRect(rect, 6, 6)
            painter.setFont(self.font())
            painter.setPen(QColor(theme.TEXT if generated else theme.TEXT_MUTED))
            painter.drawText(rect, int(Qt.AlignmentFlag.AlignCenter), label)
            if generated:
                prob = self.probs[n] if n < len(self.probs) else None
                track = QRectF(rect.left() + 3, rect.bottom() + 4, rect.width() - 6, BAR_H)
                painter.setPen(Qt.PenStyle.NoPen)
                painter.setBrush(QColor(theme.RAISED))
                painter.drawRoundedRect(track, 2, 2)
                if prob is not None:
                    fill = QRectF(track.left(), track.top(), track.width() * prob, BAR_H)
                    painter.setBrush(QColor(theme.CURRENT if selected else theme.ACCENT))
                    painter.drawRoundedRect(fill, 2, 2)
        if n_prompt and self.tokens:  # an arrow between the prompt and the answer
            last = self._rects[n_prompt - 1]
            x = last.right() + CHIP_GAP + 3
            y = last.center().y()
            painter.setPen(QPen(QColor(theme.EDGE), 1.5))
            painter.drawLine(int(x), int(y), int(x + 8), int(y))
            painter.drawLine(int(x + 8), int(y), int(x + 4), int(y - 4))
            painter.drawLine(int(x + 8), int(y), int(x + 4), int(y + 4))
        painter.setFont(self._small)
        painter.setPen(QColor(theme.TEXT_MUTED))
        if self.prompt:
            first = self._rects[0]
            painter.drawText(
                QRectF(first.left(), first.bottom() + BAR_H + 5, 200, 18),
                int(Qt.AlignmentFlag.AlignLeft),
                "prompt",
            )
        if self.tokens:
            first = self._rects[n_prompt]
            painter.drawText(
                QRectF(first.left(), first.bottom() + BAR_H + 5, 300, 18),
                int(Qt.AlignmentFlag.AlignLeft),
                "generated · bar = probability",
            )
        painter.end()

    def mousePressEvent(self, event: QMouseEvent) -> None:
        n = self.pass_at(event.position().x(), event.position().y())
        if n is not None:
            self.passClicked.emit(n)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        n = self.pass_at(event.position().x(), event.position().y())
        if n is None:
            self.setCursor(Qt.CursorShape.ArrowCursor)
            self.setToolTip("")
            return
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        prob = self.probs[n] if n < len(self.probs) else None
        p = "" if prob is None else f" with p = {prob:.3f}"
        self.setToolTip(f"pass {n + 1}: chose {self.name(self.tokens[n])}{p}")

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() == Qt.Key.Key_Right and self.selected + 1 < len(self.tokens):
            self.passClicked.emit(self.selected + 1)
        elif event.key() == Qt.Key.Key_Left and self.selected > 0:
            self.passClicked.emit(self.selected - 1)
        else:
            super().keyPressEvent(event)


# --------------------------------------------------------------------------- the view


class GenerationView(QWidget):
    """Token timeline, pass navigation and the selected pass's attention map.

    ``set_generation(gen)``, then listen to :attr:`passSelected` (pass index) and
    :attr:`traceSelected` (that pass's ``Trace``) to show it in the main view.
    """

    passSelected = Signal(int)
    traceSelected = Signal(object)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("generationView")
        self.generation: GenerationTrace | None = None
        self.current = -1
        self.name: Callable[[int], str] = token_label
        self._build_title()
        self._build_timeline()
        self._build_pass_table()
        self._build_attention()
        self._build_layout()
        self.set_generation(None)

    # --------------------------------------------------------------------- building

    def _build_title(self) -> None:
        """The heading: prompt → answer · passes."""
        self.title = QLabel("Generation")
        self.title.setObjectName("generationTitle")
        make_heading(self.title)

    def _build_timeline(self) -> None:
        """The token chips in a scroll area, and the buttons that step between passes."""
        self.timeline = TokenTimeline()
        self.timeline.passClicked.connect(self.select_pass)
        self.scroll = QScrollArea()
        self.scroll.setWidget(self.timeline)
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setFixedHeight(self.timeline.height() + 12)
        self.prev_button = self._pass_button(
            "prevPass",
            QStyle.StandardPixmap.SP_MediaSeekBackward,
            "Prev pass",
            "The pass before: one token less in the sequence",
            -1,
        )
        self.next_button = self._pass_button(
            "nextPass",
            QStyle.StandardPixmap.SP_MediaSeekForward,
            "Next pass",
            "The pass after: one token more in the sequence",
            +1,
        )
        self.info = QLabel(" ")
        self.info.setObjectName("generationInfo")
        self.info.setTextFormat(Qt.TextFormat.RichText)

        self.nav = nav = QHBoxLayout()
        nav.setSpacing(6)
        nav.addWidget(self.prev_button)
        nav.addWidget(self.next_button)
        nav.addSpacing(10)
        nav.addWidget(self.info, 1)

    def _pass_button(self, name: str, icon, text: str, tip: str, delta: int) -> QToolButton:
        button = QToolButton()
        button.setObjectName(name)
        button.setIcon(self.style().standardIcon(icon))
        button.setText(text)
        button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        button.setToolTip(tip)
        button.clicked.connect(lambda: self.select_pass(self.current + delta))
        return button

    def _build_pass_table(self) -> None:
        """One row per pass: what it saw, what it chose, how sure it was."""
        self.pass_table = QTableWidget(0, 5)
        self.pass_table.setObjectName("passTable")
        self.pass_table.setHorizontalHeaderLabels(["pass", "saw", "chose", "p", "steps"])
        self.pass_table.verticalHeader().hide()
        self.pass_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.pass_table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.pass_table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.pass_table.setShowGrid(False)
        self.pass_table.setAlternatingRowColors(True)
        self.pass_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.pass_table.verticalHeader().setDefaultSectionSize(
            self.pass_table.fontMetrics().height() + 6
        )
        self.pass_table.currentCellChanged.connect(lambda row, *_: self.select_pass(row))

    def _build_attention(self) -> None:
        """The selected pass's attention map, which grows with the sequence, and its
        layer and head choosers."""
        self.layer_combo = QComboBox()
        self.layer_combo.setObjectName("generationLayer")
        self.layer_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.layer_combo.currentIndexChanged.connect(lambda _i: self._show_attention())
        self.head_spin = QSpinBox()
        self.head_spin.setObjectName("generationHead")
        self.head_spin.setMinimumWidth(56)
        self.head_spin.valueChanged.connect(lambda _v: self._show_attention())
        self.attention_caption = hint_label()
        controls = QHBoxLayout()
        controls.setSpacing(6)
        controls.addWidget(QLabel("Layer"))
        controls.addWidget(self.layer_combo)
        controls.addWidget(QLabel("Head"))
        controls.addWidget(self.head_spin)
        controls.addStretch(1)
        self.heatmap = HeatmapView(scale_key="generation")
        self.heatmap.setObjectName("generationHeatmap")
        self.attention_pane = right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.setSpacing(4)
        label = QLabel("ATTENTION IN THIS PASS")
        label.setObjectName("paneTitle")
        right_layout.addWidget(label)
        right_layout.addLayout(controls)
        right_layout.addWidget(self.heatmap, 1)
        right_layout.addWidget(self.attention_caption)

    def _build_layout(self) -> None:
        """Timeline, navigation and passes on the left, the attention map on the right."""
        left = column(self.scroll, self.nav, (self.pass_table, 1), spacing=6)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(left)
        self.splitter.addWidget(self.attention_pane)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([700, 560])

        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.setSpacing(6)
        layout.addWidget(self.title)
        layout.addWidget(self.splitter, 1)

    # --------------------------------------------------------------------- input

    def set_generation(self, generation: GenerationTrace | None, select: int = 0) -> None:
        """Show a traced generation and select pass ``select`` (emits the selection)."""
        self.generation = generation
        self.current = -1
        if generation is None or not generation.passes:
            self.timeline.set_sequence([], [], [])
            self._fill_pass_table(None)
            self.title.setText("Generation")
            self.info.setText(
                f"<span style='color:{theme.TEXT_FAINT}'>No generation traced. "
                "Use <b>File ▸ Trace generation…</b></span>"
            )
            self.heatmap.show_message("Trace a generation to see its passes.")
            self._update_buttons()
            return
        self.name = self.timeline.name = token_namer(generation.passes[0].meta)
        self.timeline.set_sequence(generation.prompt, generation.tokens, generation.probs)
        self._fill_pass_table(generation)
        prompt = "".join(self.name(t) for t in generation.prompt)
        answer = "".join(self.name(t) for t in generation.tokens)
        n = len(generation.passes)
        self.title.setText(
            f"Generation · “{prompt}” → “{answer}” · {n} pass{'es' if n != 1 else ''}"
        )
        maps = generation.attention_maps(0)
        self.layer_combo.blockSignals(True)
        self.layer_combo.clear()
        self.layer_combo.addItems(list(maps))
        self.layer_combo.setCurrentIndex(max(0, len(maps) - 1))  # the last layer first
        self.layer_combo.blockSignals(False)
        self.select_pass(select)

    def select_pass(self, n: int) -> None:
        """Select pass ``n``: timeline, info line, attention map; emit the selection."""
        gen = self.generation
        if gen is None or not gen.passes:
            return
        n = max(0, min(n, len(gen.passes) - 1))
        if n == self.current:
            return
        self.current = n
        self.timeline.set_selected(n)
        if self.pass_table.currentRow() != n:
            self.pass_table.blockSignals(True)
            self.pass_table.selectRow(n)
            self.pass_table.blockSignals(False)
        entry = gen.timeline()[n]
        trace = gen.passes[n]
        p = "" if entry.prob is None else f" (p = {entry.prob:.3f})"
        self.info.setText(
            f"<b>pass {n + 1} / {len(gen.passes)}</b> · saw {entry.context_length} tokens · "
            f"chose <b style='color:{theme.CURRENT}'>{self.name(entry.token)}</b>{p} · "
            f"{len(trace.steps)} steps"
        )
        self._update_buttons()
        self._show_attention()
        self.passSelected.emit(n)
        self.traceSelected.emit(trace)

    @property
    def current_trace(self) -> Trace | None:
        if self.generation is None or self.current < 0:
            return None
        return self.generation.passes[self.current]

    # --------------------------------------------------------------------- internals

    def _fill_pass_table(self, gen: GenerationTrace | None) -> None:
        table = self.pass_table
        table.blockSignals(True)
        entries = gen.timeline() if gen is not None else []
        table.setRowCount(len(entries))
        for row, e in enumerate(entries):
            cells = [
                str(row + 1),
                f"{e.context_length} tokens",
                self.name(e.token),
                "–" if e.prob is None else f"{e.prob:.3f}",
                str(len(gen.passes[row].steps)),
            ]
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                table.setItem(row, col, item)
        table.blockSignals(False)

    def _update_buttons(self) -> None:
        count = len(self.generation.passes) if self.generation is not None else 0
        self.prev_button.setEnabled(self.current > 0)
        self.next_button.setEnabled(0 <= self.current < count - 1)

    def _show_attention(self) -> None:
        gen = self.generation
        if gen is None or self.current < 0:
            return
        maps = gen.attention_maps(self.current)
        name = self.layer_combo.currentText()
        if name not in maps:
            self.heatmap.show_message("This pass recorded no attention map for that layer.")
            return
        w = maps[name]  # (B, H, T, T)
        H = int(w.shape[1])
        self.head_spin.blockSignals(True)
        self.head_spin.setRange(0, max(0, H - 1))
        self.head_spin.blockSignals(False)
        head = self.head_spin.value()
        trace = gen.passes[self.current]
        ids = trace.meta.get("tokens") or gen.sequence[: w.shape[-1]]
        labels = [self.name(int(t)) for t in ids][-w.shape[-1] :]
        self.heatmap.set_matrix(
            w[0, head],
            row_labels=labels,
            col_labels=labels,
            row_name="query",
            col_name="key",
            scale="probability",
            levels=(0.0, 1.0),
        )
        self.attention_caption.setText(f"{name} · head {head} · {w.shape[-2]} × {w.shape[-1]}")


__all__ = ["GenerationView", "TokenTimeline", "TraceGenerationDialog"]


# --------------------------------------------------------------------------- main window


class GenerationController(QObject):
    """File ▸ Trace generation… in the main window: the dialog, the worker, the dock.

    Selecting a pass in the dock loads that pass's trace into the window at the same step
    index, so stepping across passes keeps the place within a pass.
    """

    ended = Signal()  # a generation job finished, failed or was cancelled

    def __init__(self, window):
        super().__init__(window)
        self.window = window
        self.job: GenerationJob | None = None
        self.progress_dialog = None
        self.request: GenerationRequest | None = None
        self.dock = QDockWidget("Generation", window)
        self.dock.setObjectName("generationDock")
        self.view = GenerationView(self.dock)
        self.dock.setWidget(self.view)
        self.view.passSelected.connect(self._show_pass)

        self.action = QAction("Trace &generation…", window)
        self.action.setShortcut(QKeySequence("Ctrl+Shift+G"))  # Ctrl+G: go to step
        self.action.setStatusTip("Generate tokens and trace one forward pass per new token")
        self.action.triggered.connect(lambda _checked=False: self.open_dialog())
        window.installEventFilter(self)  # cancel a running job when the window closes
        window.add_menu_action("File", self.action, after=window.new_action)
        window.add_dock(self.dock, Qt.DockWidgetArea.BottomDockWidgetArea, "&Generation timeline")

    # ---- running

    def open_dialog(self) -> None:
        source = ModelSource("demo")
        prompt = self.request.prompt if self.request is not None else "transformer|"
        dialog = TraceGenerationDialog(self.window, prompt, source.describe())
        if dialog.exec():
            self.start(dialog.request(source))

    def eventFilter(self, watched, event) -> bool:
        if watched is self.window and event.type() == QEvent.Type.Close:
            self.shutdown()
        return False

    def start(self, request: GenerationRequest) -> GenerationJob | None:
        """Run a generation off the GUI thread, with a progress dialog that can cancel it."""
        if self.job is not None:
            self.window.statusBar().showMessage("A generation is already running.", 4000)
            return None
        self.request = request
        job = GenerationJob(request)
        self.job = job
        self.progress_dialog = dialogs.cancellable_progress(
            self.window,
            "Tracing the generation…",
            "Trace generation",
            request.max_new_tokens,
            job.cancel,
        )
        job.progress.connect(self._on_progress)
        job.finished.connect(self._on_finished)
        job.failed.connect(self._on_failed)
        self.window.statusBar().showMessage(
            f"Tracing {request.max_new_tokens} generation passes with {request.source.describe()}…"
        )
        job.start()
        return job

    def _on_progress(self, done: int, total: int) -> None:
        if self.progress_dialog is not None:
            self.progress_dialog.setLabelText(f"Tracing pass {min(done + 1, total)} of {total}…")
            self.progress_dialog.setValue(min(done, total))

    def _on_finished(self, outcome: GenerationOutcome) -> None:
        try:
            self._close_progress()
            if outcome.status == "cancelled" or outcome.generation is None:
                self.window.statusBar().showMessage("Generation cancelled.", 5000)
                return
            self.show_generation(outcome.generation, outcome.model)
            self.window.statusBar().showMessage(
                f"Traced {len(outcome.generation.passes)} generation passes.", 5000
            )
        finally:
            self._end_job()

    def _on_failed(self, title: str, text: str) -> None:
        self._close_progress()
        try:
            dialogs.show_error(self.window, title, text)
        finally:
            self._end_job()

    def show_generation(self, generation: GenerationTrace, model=None) -> None:
        """Show ``generation`` in the dock and its first pass in the window."""
        self.window.trace_models.clear()
        if model is not None:
            for t in generation.passes:
                self.window.trace_models[id(t)] = model
        self.dock.show()
        self.dock.raise_()
        self.view.set_generation(generation)  # selects pass 0: loads it

    def _show_pass(self, n: int) -> None:
        gen = self.view.generation
        if gen is None:
            return
        start = max(0, self.window.current) if self.window.trace is not None else 0
        self.window.set_trace(gen.passes[n], path=None, start=start)
        self.window.statusBar().showMessage(
            f"Generation pass {n + 1} of {len(gen.passes)} ({len(gen.passes[n].steps)} steps)",
            3000,
        )

    def _close_progress(self) -> None:
        dialogs.close_progress(self.progress_dialog)
        self.progress_dialog = None

    def _end_job(self) -> None:
        job, self.job = self.job, None
        if job is not None:
            job.wait()
            job.deleteLater()
        self.ended.emit()

    def shutdown(self) -> None:
        """Cancel a running generation and wait for its thread (the window is closing)."""
        if self.job is not None:
            self.job.cancel()
            self.job.wait(10_000)


def attach(window) -> GenerationController:
    """File ▸ Trace generation… (Ctrl+G) and a Generation dock (View ▸ Generation timeline)."""
    return GenerationController(window)
