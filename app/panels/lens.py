"""The lens view: what each layer would predict, and how much each attention head writes.

::

    ┌ Logit lens · 16 tokens · 3 read-outs ───────────────────────────────────────────┐
    │ position  │ embeddings │ blocks.0  │ blocks.1  ║ P(final prediction)  │ heads   │
    │ 0  's'    │ 'o' 12%    │ 'o' 40%   │ 'o' 97%   ║ T x layers heatmap   │ layers  │
    │ 1  'o'    │ ...        │           │           ║                      │ x heads │
    └─────────────────────────────────────────────────────────────────────────────────┘

- **Logit lens grid** (tokens x layers): for each position and each layer, the token the
  model would predict if it stopped after that layer (the residual stream read out through
  the final norm and the LM head, :func:`tracing.lens.logit_lens`), with its probability.
  The text is the token, the colour is the probability (the same ``inferno`` map as the
  attention heatmaps); a tick marks a prediction that equals the prompt's next token.
  The last column is the model's real output.
- **P(final prediction)**: for every position, the probability each layer already gives to
  the token the whole model ends up predicting: watch the answer form layer by layer.
- **Head contributions** (layers x heads): the mean norm of what each head writes into the
  residual stream through ``W_o`` (:func:`tracing.lens.head_contributions`).

Both read-outs need the model's weights, and the trace's kept values. The window hands the
model over when it traced the prompt itself; a trace opened from a file comes without a
model, and the view says so instead of showing empty boxes. The work runs the first time
the view is shown (a big vocabulary makes it seconds, not milliseconds).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDockWidget,
    QHeaderView,
    QLabel,
    QSplitter,
    QStackedWidget,
    QTableView,
    QWidget,
)

from app import theme
from app.core import session
from app.theme import PROBABILITY_CMAP
from app.widgets.common import column, hint_label, make_heading, monospace_font, titled
from app.widgets.heatmap import HeatmapView, colormap
from app.widgets.tensor_view import token_label
from tracing.analysis.lens import find_attention_modules, head_contributions, logit_lens
from tracing.token_names import token_namer

if TYPE_CHECKING:  # pragma: no cover
    import torch.nn as nn

    from tracing import Trace
    from tracing.analysis.lens import LensResult

TOP_K = 5

NO_MODEL_MESSAGE = (
    "<p style='font-size:12pt'><b>The lens needs the model.</b></p>"
    "<p>The logit lens reads the residual stream out through the model's final norm and "
    "LM head, and head contributions need its <code>W_o</code> weights. This trace was "
    "opened from a file, which holds tensors but no model.</p>"
    "<p>Trace a prompt with <b>File ▸ New trace…</b> (the bundled demo, a preset or a "
    "checkpoint) and the lens fills in.</p>"
)


def short_layer(path: str) -> str:
    """``blocks.1.self_attn`` -> ``blocks.1``; ``embeddings`` stays."""
    parts = path.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return path


# --------------------------------------------------------------------------- item model


class LensTableModel(QAbstractTableModel):
    """Tokens x layers: the top prediction of each layer at each position.

    A thin adapter over a :class:`tracing.lens.LensResult`: rows are positions, columns
    are read-outs (layers). ``TokenRole`` gives the predicted token id, ``ProbRole`` its
    probability, for tests and callers.
    """

    TokenRole = Qt.ItemDataRole.UserRole + 1
    ProbRole = Qt.ItemDataRole.UserRole + 2

    def __init__(self, parent=None):
        super().__init__(parent)
        self.lens: LensResult | None = None
        self.name: Callable[[int], str] = token_label  # id -> text (the trace's tokenizer)
        self._cmap = colormap(PROBABILITY_CMAP)
        self._bold = QFont()
        self._bold.setBold(True)

    def set_lens(self, lens: LensResult | None) -> None:
        self.beginResetModel()
        self.lens = lens
        self.endResetModel()

    # ---- shape

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex | None = None) -> int:
        if (parent is not None and parent.isValid()) or self.lens is None:
            return 0
        return int(self.lens.shape[1])

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex | None = None) -> int:
        if (parent is not None and parent.isValid()) or self.lens is None:
            return 0
        return int(self.lens.shape[0])

    # ---- content

    def next_input(self, position: int) -> int | None:
        """The prompt's token after ``position`` (what a perfect model would predict)."""
        tokens = self.lens.input_tokens if self.lens is not None else None
        if tokens is None or position + 1 >= len(tokens):
            return None
        return tokens[position + 1]

    def data(self, index, role=Qt.ItemDataRole.DisplayRole) -> Any:
        lens = self.lens
        if lens is None or not index.isValid():
            return None
        t, layer = index.row(), index.column()
        if not (0 <= t < lens.shape[1] and 0 <= layer < lens.shape[0]):
            return None
        token = int(lens.top_tokens[layer, t, 0])
        prob = float(lens.top_probs[layer, t, 0])
        hit = self.next_input(t) == token
        if role == Qt.ItemDataRole.DisplayRole:
            return f"{self.name(token)}   {prob:.0%}" + ("  ✓" if hit else "")
        if role == Qt.ItemDataRole.BackgroundRole:
            return self._colour(prob)
        if role == Qt.ItemDataRole.ForegroundRole:
            dark_text = self._colour(prob).lightness() > 140
            return QColor(theme.TEXT_ON_LIGHT if dark_text else theme.TEXT_ON_DARK)
        if role == Qt.ItemDataRole.FontRole:
            return self._bold if hit else None
        if role == Qt.ItemDataRole.TextAlignmentRole:
            return int(Qt.AlignmentFlag.AlignCenter)
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._tooltip(t, layer)
        if role == self.TokenRole:
            return token
        if role == self.ProbRole:
            return prob
        return None

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole) -> Any:
        lens = self.lens
        if lens is None:
            return None
        if orientation == Qt.Orientation.Horizontal:
            if not 0 <= section < lens.shape[0]:
                return None
            if role == Qt.ItemDataRole.DisplayRole:
                name = short_layer(lens.layers[section])
                return f"{name}\n(output)" if section == lens.shape[0] - 1 else name
            if role == Qt.ItemDataRole.ToolTipRole:
                return f"read-out after {lens.layers[section]}"
            return None
        if not 0 <= section < lens.shape[1]:
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            tokens = lens.input_tokens
            label = f" {self.name(tokens[section])}" if tokens else ""
            return f"{section}{label}"
        if role == Qt.ItemDataRole.ToolTipRole:
            nxt = self.next_input(section)
            return (
                f"position {section}; the prompt continues with "
                f"{self.name(nxt) if nxt is not None else '(end)'}"
            )
        return None

    def flags(self, index):
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable

    def _colour(self, prob: float) -> QColor:
        # keep the darkest end off pure black so text and grid stay readable
        return self._cmap.map(0.08 + 0.88 * min(max(prob, 0.0), 1.0), mode="qcolor")

    def _tooltip(self, t: int, layer: int) -> str:
        lens = self.lens
        assert lens is not None
        rows = "".join(
            f"<tr><td><code>{html.escape(self.name(int(tok)))}</code>&nbsp;&nbsp;</td>"
            f"<td align='right'>{float(p):.1%}</td></tr>"
            for tok, p in zip(lens.top_tokens[layer, t], lens.top_probs[layer, t])
        )
        final = int(lens.final_tokens[t])
        return (
            f"<b>position {t} · after {html.escape(lens.layers[layer])}</b>"
            f"<table>{rows}</table>"
            f"P(final prediction <code>{html.escape(self.name(final))}</code>) = "
            f"{float(lens.final_token_probs[layer, t]):.1%}"
        )


# --------------------------------------------------------------------------- the view


def _titled(title: str, widget: QWidget, hint: str) -> QWidget:
    """A titled pane, packed tighter than the main window's (the lens dock is short)."""
    return titled(title, widget, hint, margins=(0, 6, 0, 0), spacing=3)


class LensView(QWidget):
    """Logit lens grid, final-token probability per layer, head contributions.

    ``set_trace(trace, model)``; without a model the view explains why it is empty.
    """

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("lensView")
        self.trace: Trace | None = None
        self.model: nn.Module | None = None
        self.lens: LensResult | None = None
        self.contributions: np.ndarray | None = None  # (layers, heads)
        self.head_layers: list[str] = []
        self.error = ""
        self._dirty = False
        self._model_factory: Callable[[], nn.Module | None] | None = None
        self._build_header()
        self._build_pages(self._build_grid(), self._build_heatmaps())
        column(self.title, self.subtitle, (self.pages, 1), margins=(8, 8, 8, 8), spacing=4, on=self)
        self._show_message("Open or trace a prompt to see the logit lens.")

    # --------------------------------------------------------------------- building

    def _build_header(self) -> None:
        """The title and what the lens shows."""
        self.title = QLabel("Logit lens")
        self.title.setObjectName("lensTitle")
        make_heading(self.title)
        self.subtitle = hint_label(
            "What each layer would predict if the model stopped there: the residual stream "
            "after each block, read out through the final norm and the LM head.",
            wrap=True,
        )

    def _build_grid(self) -> QWidget:
        """The table: the top prediction per position (rows) and layer (columns)."""
        self.table_model = LensTableModel(self)
        self.grid = QTableView()
        self.grid.setObjectName("lensGrid")
        self.grid.setModel(self.table_model)
        self.grid.setShowGrid(True)
        self.grid.setWordWrap(False)
        self.grid.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.grid.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.grid.horizontalHeader().setMinimumSectionSize(80)
        self.grid.verticalHeader().setDefaultSectionSize(self.grid.fontMetrics().height() + 10)
        self.grid.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.grid.setFont(monospace_font())
        return _titled(
            "Top prediction per position and layer",
            self.grid,
            "colour = probability · ✓ = the prompt's next token",
        )

    def _build_heatmaps(self) -> QWidget:
        """P(final prediction) per layer over the head contributions."""
        self.final_heatmap = HeatmapView(scale_key="lens.final")
        self.final_heatmap.setObjectName("lensFinalHeatmap")
        final_box = _titled(
            "P(final prediction) per layer",
            self.final_heatmap,
            "how sure each layer already is of the token the model ends up predicting",
        )
        self.heads_heatmap = HeatmapView(scale_key="lens.heads")
        self.heads_heatmap.setObjectName("headContributions")
        heads_box = _titled(
            "Head contributions",
            self.heads_heatmap,
            "mean ‖what each head writes into the residual stream‖ (through W_o)",
        )
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(final_box)
        right.addWidget(heads_box)
        right.setChildrenCollapsible(False)
        right.setSizes([380, 300])
        return right

    def _build_pages(self, grid: QWidget, heatmaps: QWidget) -> None:
        """The grid beside the heatmaps, or a message page when there is nothing to show."""
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(grid)
        self.splitter.addWidget(heatmaps)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setStretchFactor(0, 3)
        self.splitter.setStretchFactor(1, 2)
        self.message = QLabel()
        self.message.setObjectName("lensMessage")
        self.message.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.message.setWordWrap(True)
        self.message.setTextFormat(Qt.TextFormat.RichText)
        self.message.setMargin(40)

        self.pages = QStackedWidget()
        self.pages.addWidget(self.splitter)
        self.pages.addWidget(self.message)

    # --------------------------------------------------------------------- input

    def set_trace(
        self,
        trace: Trace | None,
        model: nn.Module | None = None,
        model_factory: Callable[[], nn.Module | None] | None = None,
    ) -> None:
        """Show the lens of ``trace`` (needs ``model`` for the weights). Computed lazily:
        now when the view is visible, else the next time it is shown.

        ``model_factory`` builds the model on first need instead (the main window rebuilds
        the demo, a seeded preset or a checkpoint only when the lens is actually shown)."""
        self.trace, self.model = trace, model
        self.table_model.name = token_namer(trace.meta) if trace is not None else token_label
        self._model_factory = model_factory if model is None else None
        self.lens, self.contributions, self.head_layers, self.error = None, None, [], ""
        self._dirty = True
        if self.isVisible():
            self.refresh()

    @property
    def has_data(self) -> bool:
        return self.lens is not None

    @property
    def message_text(self) -> str:
        return self.message.text() if self.pages.currentWidget() is self.message else ""

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self._dirty:
            self.refresh()

    def refresh(self) -> None:
        """Compute the read-outs for the current trace and model, and show them."""
        self._dirty = False
        trace, model = self.trace, self.model
        if trace is None or not trace.steps:
            self._show_message("Open or trace a prompt to see the logit lens.")
            return
        if model is None and self._model_factory is not None:
            try:
                model = self.model = self._model_factory()
            except Exception as e:  # a checkpoint that moved away, a preset that fails
                self._show_message(
                    "<p style='font-size:12pt'><b>Cannot load the model for the lens.</b></p>"
                    f"<p>{html.escape(str(e))}</p>"
                )
                return
            finally:
                self._model_factory = None
        if model is None:
            self._show_message(NO_MODEL_MESSAGE)
            return
        if trace.meta.get("capture") in ("shapes", "stats"):
            self._show_message(
                "<p style='font-size:12pt'><b>The lens needs tensor values.</b></p>"
                f"<p>This trace was captured at level <code>{trace.meta['capture']}</code>, "
                "which keeps no residual stream. Trace again with capture "
                "<code>values</code>.</p>"
            )
            return
        try:
            lens = logit_lens(model, trace, include_embeddings=True, top_k=TOP_K)
        except (ValueError, KeyError, RuntimeError) as e:
            self.error = str(e)
            self._show_message(
                "<p style='font-size:12pt'><b>No logit lens for this trace.</b></p>"
                f"<p>{html.escape(str(e))}</p>"
            )
            return
        self.lens = lens
        self.table_model.set_lens(lens)
        self._fill_final_heatmap(lens)
        try:
            self.head_layers = find_attention_modules(trace)
            self.contributions = head_contributions(model, trace)
        except (ValueError, KeyError, RuntimeError) as e:
            self.contributions = None
            self.heads_heatmap.show_message(f"No head contributions: {html.escape(str(e))}")
        else:
            self._fill_heads_heatmap(self.contributions, self.head_layers)
        n_tokens = lens.shape[1]
        text = trace.meta.get("text")
        prompt = f" · “{text}”" if isinstance(text, str) and text else ""
        self.title.setText(f"Logit lens · {n_tokens} tokens · {lens.shape[0]} read-outs{prompt}")
        self.pages.setCurrentWidget(self.splitter)

    # --------------------------------------------------------------------- parts

    def top_token(self, position: int, layer: int) -> int:
        """The grid's top token at (position, layer) as the user sees it (layer -1: output)."""
        column = layer % self.table_model.columnCount()
        return int(
            self.table_model.data(
                self.table_model.index(position, column), LensTableModel.TokenRole
            )
        )

    def _fill_final_heatmap(self, lens: LensResult) -> None:
        tokens = lens.input_tokens
        rows = [self.table_model.name(t) for t in tokens] if tokens else None
        cols = [short_layer(name) for name in lens.layers]
        self.final_heatmap.set_matrix(
            lens.final_token_probs.T,  # (T, L): positions down, layers across, like the grid
            row_labels=rows,
            col_labels=cols,
            row_name="T",
            col_name="layer",
            scale="probability",
            levels=(0.0, 1.0),
        )

    def _fill_heads_heatmap(self, contributions: np.ndarray, layers: list[str]) -> None:
        L, H = contributions.shape
        self.heads_heatmap.set_matrix(
            contributions,
            row_labels=[short_layer(p) for p in layers] if len(layers) == L else None,
            col_labels=[f"h{h}" for h in range(H)],
            row_name="layer",
            col_name="head",
            scale="sequential",
        )

    def _show_message(self, text: str) -> None:
        self.table_model.set_lens(None)
        self.message.setText(text)
        self.pages.setCurrentWidget(self.message)
        self.title.setText("Logit lens")


__all__ = ["NO_MODEL_MESSAGE", "LensTableModel", "LensView", "short_layer"]


# --------------------------------------------------------------------------- main window


def attach(window):
    """Add a Lens dock to the main window (hidden; View ▸ Lens, Ctrl+L).

    The lens needs the model that produced the trace: for a trace the window traced itself
    it rebuilds that model from the request (the bundled demo, a seeded preset, a
    checkpoint) the first time the dock is shown; ``window.trace_models`` maps
    ``id(trace)`` to a model already at hand (a traced generation fills it). A trace opened
    from a file has no model, and the dock says so.
    """
    dock = QDockWidget("Lens", window)
    dock.setObjectName("lensDock")
    view = LensView(dock)
    dock.setWidget(view)

    def model_factory_for(trace):
        if trace is None or getattr(window, "trace_path", None) is not None:
            return None  # opened from a file: no model
        job = getattr(window, "job", None)
        source = None
        if job is not None and getattr(job, "request", None) is not None:
            source = job.request.source  # the window is showing this job's outcome
        elif trace.meta.get("model_source") == session.ModelSource("demo").describe():
            source = session.ModelSource("demo")
        if source is None:
            return None
        return lambda: session.build_model(source)[0]

    def on_trace_changed() -> None:
        trace = window.trace
        model = window.trace_models.get(id(trace)) if trace is not None else None
        view.set_trace(trace, model, model_factory=None if model else model_factory_for(trace))

    window.traceChanged.connect(on_trace_changed)
    on_trace_changed()
    window.add_dock(
        dock,
        Qt.DockWidgetArea.BottomDockWidgetArea,
        "&Lens (logit lens, heads)",
        shortcut="Ctrl+L",
        tip="What each layer predicts, and what each head writes",
    )
    dock.view = view
    return dock
