"""The rank window: a set of rank files (one run under ``torch.distributed``) as one session.

::

    ┌ Ranks ─ world 2 · gloo ─ Rank A [0 ▾]  Rank B [1 ▾]  [x] only what should agree ───┐
    │ ┌ the compare view of rank A and rank B, stepped together ──────┐ ACROSS RANKS       │
    │ │ A · t.rank0.sft          │ B · t.rank1.sft       │ first div. │ ● r1 step 41 ...   │
    │ │  boxes coloured by divergence where ranks should agree       │ COLLECTIVES        │
    │ └──────────────────────────────────────────────────────────────┘ STITCHED           │
    └──────────────────────────────────────────────────────────────────────────────────────┘

- **Rank selector**: any two ranks side by side, in the compare view
  (``app.windows.compare_window``), stepped together.
- **Divergence**: with "only what should agree" (the default) the view colours only steps
  whose outputs should be equal on every rank (``tracing.ranks``: collective results,
  ``Replicate`` DTensors, DDP replicas fed equal inputs); shards keep a grey mark. The
  "Across ranks" list holds every such divergence on every rank, earliest first; the
  window opens on the first one.
- **Collectives**: each one with its group and ranks; a click jumps to it.
- **Stitched**: for a step whose output is a sharded DTensor, the global tensor stitched
  from every rank's shard — its heatmap and its statistics (pooled from the shards'
  statistics when no values were kept).
"""

from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.commands.app import is_rank_set  # the command line's test, re-exported here
from app.diagram.divergence import divergence_colour
from app.widgets.common import column
from app.widgets.heatmap import HeatmapView
from app.widgets.tensor_view import as_matrix, axis_names
from app.windows import dialogs
from app.windows.compare_window import CompareWindow
from tracing.analysis.divergence import entry_score, score_text
from tracing.analysis.rank_report import collective_detail, placements_text
from tracing.analysis.ranks import RankDivergence, RankSet, collectives_of, layout_of, load_ranks
from tracing.capture.distributed import rank_siblings
from tracing.errors import TraceFileError
from tracing.formatting import step_number, step_text


class RankWindow(QMainWindow):
    """``RankWindow(ranks)`` for a :class:`tracing.ranks.RankSet`, or :meth:`from_files`.
    ``pairChanged(a, b)`` follows the rank selectors."""

    pairChanged = Signal(int, int)

    def __init__(self, ranks: RankSet, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("rankWindow")
        self.ranks = ranks
        for trace in ranks.traces.values():  # before the divergences read their values
            dialogs.warn_on_unreadable_values(self, trace)
        first = ranks.first
        backend = first.meta.get("backend", "?")
        self.setWindowTitle(f"Ranks: world {ranks.world_size} · {backend} — Scratchformer")
        self.resize(1760, 960)
        self.divergences: list[RankDivergence] = ranks.divergences()
        self.compare: CompareWindow | None = None
        self.pair: tuple[int, int] = (-1, -1)
        top = self._build_top_bar()
        self._build_tabs()
        self.compare_holder = QWidget()
        self.compare_layout = QVBoxLayout(self.compare_holder)
        self.compare_layout.setContentsMargins(0, 0, 0, 0)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self.compare_holder)
        self.splitter.addWidget(self.tabs)
        self.splitter.setSizes([1400, 360])
        self.setCentralWidget(column(top, (self.splitter, 1), spacing=0))

        self._fill_across()
        self._fill_collectives()
        a = ranks.ranks[0]
        b = self.divergences[0].rank if self.divergences else ranks.ranks[min(1, len(ranks) - 1)]
        self.set_pair(a, b)
        self.rank_a.currentIndexChanged.connect(self._on_selectors)
        self.rank_b.currentIndexChanged.connect(self._on_selectors)
        self.agree_only.toggled.connect(lambda _on: self.set_pair(*self.pair, force=True))
        if self.divergences:
            self.go_to_divergence(self.divergences[0])

    # --------------------------------------------------------------------- building

    def _build_top_bar(self) -> QWidget:
        """What the set is, the two ranks shown, the filter."""
        ranks, first = self.ranks, self.ranks.first
        backend = first.meta.get("backend", "?")
        self.rank_a = QComboBox()
        self.rank_a.setObjectName("rankA")
        self.rank_b = QComboBox()
        self.rank_b.setObjectName("rankB")
        for rank in ranks:
            name = ranks.paths[rank].name if rank in ranks.paths else f"rank {rank}"
            for combo in (self.rank_a, self.rank_b):
                combo.addItem(f"rank {rank} · {name}", rank)
        self.agree_only = QCheckBox("only what should agree")
        self.agree_only.setObjectName("agreeOnly")
        self.agree_only.setChecked(True)
        self.agree_only.setToolTip(
            "Colour only steps whose outputs should be equal on every rank (collective "
            "results, Replicate DTensors, replicas); shards are expected to differ"
        )
        model = str(first.meta.get("model_class", "model")).rsplit(".", 1)[-1]
        summary = f"<b>world {ranks.world_size}</b> · {html.escape(str(backend))} · {model}"
        if ranks.missing:
            summary += f" · <span style='color:{theme.ERROR}'>missing ranks {ranks.missing}</span>"
        top = QWidget()
        top.setObjectName("rankBar")
        top_layout = QHBoxLayout(top)
        top_layout.setContentsMargins(8, 4, 8, 4)
        top_layout.addWidget(QLabel(summary))
        top_layout.addSpacing(16)
        top_layout.addWidget(QLabel("Rank A"))
        top_layout.addWidget(self.rank_a)
        top_layout.addWidget(QLabel("Rank B"))
        top_layout.addWidget(self.rank_b)
        top_layout.addWidget(self.agree_only)
        top_layout.addStretch(1)
        return top

    def _build_tabs(self) -> None:
        """The side tabs: divergences across ranks, collectives, a stitched tensor."""
        self.across = QListWidget()
        self.across.setObjectName("acrossRanks")
        self.across.itemClicked.connect(self._on_divergence_item)
        self.across.itemActivated.connect(self._on_divergence_item)
        self.collectives = QTableWidget(0, 5)
        self.collectives.setObjectName("collectives")
        self.collectives.setHorizontalHeaderLabels(["step", "module", "op", "group", "detail"])
        self.collectives.verticalHeader().hide()
        self.collectives.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.collectives.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.collectives.horizontalHeader().setSectionResizeMode(
            QHeaderView.ResizeMode.ResizeToContents
        )
        self.collectives.cellClicked.connect(self._on_collective)
        self.stitched_title = QLabel(" ")
        self.stitched_title.setObjectName("stitchedTitle")
        self.stitched_title.setWordWrap(True)
        self.stitched_title.setTextFormat(Qt.TextFormat.RichText)
        self.stitched_heatmap = HeatmapView()
        self.stitched_heatmap.setObjectName("stitchedHeatmap")
        stitched = column(self.stitched_title, (self.stitched_heatmap, 1), margins=(4, 6, 4, 4))
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self.across, f"Across ranks ({len(self.divergences)})")
        self.tabs.addTab(self.collectives, "Collectives")
        self.tabs.addTab(stitched, "Stitched")

    @classmethod
    def from_files(cls, paths, parent: QWidget | None = None) -> RankWindow:
        """Open rank files (or one name: its ``.rank<N>`` files); ``TraceFileError`` names
        a bad one."""
        return cls(load_ranks(paths), parent=parent)

    # --------------------------------------------------------------------- the pair

    def set_pair(self, a: int, b: int, force: bool = False) -> None:
        """Show ranks ``a`` and ``b`` side by side (the compare view is rebuilt)."""
        if (a, b) == self.pair and not force:
            return
        self.pair = (a, b)
        for combo, rank in ((self.rank_a, a), (self.rank_b, b)):
            combo.blockSignals(True)
            combo.setCurrentIndex(combo.findData(rank))
            combo.blockSignals(False)
        diff = (
            self.ranks.agreement_diff(a, b)
            if self.agree_only.isChecked()
            else self.ranks.diff(b, against=a)
        )
        names = [self.ranks.paths[r].name if r in self.ranks.paths else f"rank {r}" for r in (a, b)]
        compare = CompareWindow(
            self.ranks[a], self.ranks[b], f"rank {a} · {names[0]}", f"rank {b} · {names[1]}",
            diff=diff, parent=self.compare_holder,
        )  # fmt: skip
        compare.setWindowFlags(Qt.WindowType.Widget)
        compare.entryChanged.connect(self._on_entry)
        if self.compare is not None:
            self.compare_layout.removeWidget(self.compare)
            self.compare.deleteLater()
        self.compare = compare
        self.compare_layout.addWidget(compare)
        compare.show()
        self._on_entry(compare.position)
        self.pairChanged.emit(a, b)

    def _on_selectors(self) -> None:
        self.set_pair(self.rank_a.currentData(), self.rank_b.currentData())

    # --------------------------------------------------------------------- jumping

    def go_to_divergence(self, found: RankDivergence) -> None:
        """Show the first rank against ``found.rank``, at the step that diverged."""
        self.set_pair(self.ranks.ranks[0], found.rank)
        if found.step is not None and self.compare is not None:
            self.compare.go_to_step("a", found.step)

    def go_to_first_divergence(self) -> None:
        if self.divergences:
            self.go_to_divergence(self.divergences[0])

    def _on_divergence_item(self, item: QListWidgetItem) -> None:
        index = item.data(Qt.ItemDataRole.UserRole)
        if index is not None:
            self.go_to_divergence(self.divergences[int(index)])

    def _on_collective(self, row: int, _column: int) -> None:
        item = self.collectives.item(row, 0)
        if item is not None and self.compare is not None:
            step = int(item.text())
            if self.pair[0] != self.ranks.ranks[0]:
                self.set_pair(self.ranks.ranks[0], self.pair[1])
            self.compare.go_to_step("a", step)

    # --------------------------------------------------------------------- panels

    def _fill_across(self) -> None:
        self.across.clear()
        for i, found in enumerate(self.divergences[:2000]):
            score = entry_score(found.entry)
            where = "not on the first rank" if found.step is None else step_text(found.step)
            item = QListWidgetItem(
                f"rank {found.rank} · {where}  {found.label}   "
                f"{score_text(score, found.entry.status)} · {found.reason}"
            )
            item.setForeground(divergence_colour(score))
            item.setData(Qt.ItemDataRole.UserRole, i)
            self.across.addItem(item)
        if not self.divergences:
            item = QListWidgetItem("The ranks agree wherever they should.")
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            self.across.addItem(item)

    def _fill_collectives(self) -> None:
        first = self.ranks.first
        rows = [c for c in collectives_of(first) if "index" in c]
        self.collectives.setRowCount(len(rows))
        for row, c in enumerate(rows):
            detail = collective_detail(c)
            module = first.steps[c["index"]].module or "<root>"
            cells = [
                str(step_number(c["index"])),
                module,
                c["op"],
                f"{c['group']} {c['ranks']}",
                detail,
            ]
            carried = "\n".join(c.get("params", ()))  # a DDP bucket: whose gradients
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if carried:
                    item.setToolTip(carried)
                self.collectives.setItem(row, col, item)

    def _first_rank_step(self, entry) -> int | None:
        """The first rank's index of the compare view's current step (side A)."""
        if entry is None or entry.a_index is None:
            return None
        a = self.pair[0]
        if a == self.ranks.ranks[0]:
            return entry.a_index
        back = self.ranks.diff(a).for_step_b(entry.a_index)
        return None if back is None else back.a_index

    def _on_entry(self, _position: int) -> None:
        entry = self.compare.current_entry if self.compare is not None else None
        index = self._first_rank_step(entry)
        first = self.ranks.first
        if index is None:
            self.stitched_title.setText("No step of the first rank here.")
            self.stitched_heatmap.show_message(" ")
            return
        step = first.steps[index]
        tid = next((t for t in step.outputs if layout_of(first, t) is not None), None)
        if tid is None:
            self.stitched_title.setText(
                f"<b>{html.escape(step.label)}</b><br>Its outputs are plain tensors, "
                "not shards of a DTensor: nothing to stitch."
            )
            self.stitched_heatmap.show_message("not a DTensor")
            return
        layout = layout_of(first, tid)
        stats = self.ranks.stitched_stats(tid)
        glob = "(" + ", ".join(str(s) for s in layout["global_shape"]) + ")"
        local = "(" + ", ".join(str(s) for s in layout["local_shape"]) + ")"
        lines = [
            f"<b>{html.escape(step.label)}</b>",
            f"global {glob} · {placements_text(layout['placements'])} · local {local} on rank "
            f"{self.ranks.ranks[0]}",
        ]
        if stats is not None:
            lines.append(
                f"whole: min {stats.min:.4g} · max {stats.max:.4g} · mean {stats.mean:.4g} · "
                f"std {stats.std:.4g}" + (f" · NaN {stats.nan}" if stats.nan else "")
            )
        self.stitched_title.setText("<br>".join(lines))
        value = self.ranks.stitched(tid)
        if value is None or value.dim() == 0:
            self.stitched_heatmap.show_message(
                "No values kept on every rank: trace with capture=values to see the whole."
            )
            return
        record = first.tensors[tid]
        # the shard's axis names fit the whole only where the shard spans the whole axis
        names = [
            n if record.shape[i] == layout["global_shape"][i] else f"dim{i}"
            for i, n in enumerate(axis_names(record))
        ]
        matrix = as_matrix(value.float(), (0,) * max(0, value.dim() - 2))
        row_name, col_name = ("", names[0]) if value.dim() == 1 else (names[-2], names[-1])
        self.stitched_heatmap.set_matrix(
            matrix, row_name=row_name or " ", col_name=col_name, scale="auto"
        )


def open_ranks(paths, parent=None) -> RankWindow:
    """Build and show a rank window (kept alive by its parent, or by the caller)."""

    window = RankWindow.from_files(paths, parent=parent)
    dialogs.show_child_window(window, parent)
    return window


# --------------------------------------------------------------------------- main window


class RanksLauncher(dialogs.FileMenuLauncher):
    """File ▸ Open ranks…: several rank files in a :class:`RankWindow`."""

    def __init__(self, window):
        super().__init__(
            window,
            "Open &ranks…",
            "Open the trace files of every rank of a torch.distributed run as one session",
            after=window.compare.action,
        )
        window.traceChanged.connect(self._hint_siblings)

    def _hint_siblings(self) -> None:
        """One rank's file opened alone: say that its ranks can open together."""
        trace, path = self.window.trace, self.window.trace_path
        world = trace.meta.get("world_size") if trace is not None else None
        if path is None or not isinstance(world, int) or world < 2:
            return
        siblings = rank_siblings(path)
        if len(siblings) > 1:
            text = (
                f"rank {trace.meta.get('rank')} of {world}: File ▸ Open ranks… opens "
                f"{', '.join(p.name for p in siblings)} together"
            )
            # after the window's own "Opened ..." message
            QTimer.singleShot(0, lambda: self.window.statusBar().showMessage(text, 15000))

    def open_dialog(self) -> None:
        paths = self.ask_for_files("Open rank files", many=True)
        if paths:
            self.open_with(paths)

    def open_with(self, paths: list[Path]) -> RankWindow | None:
        """Open ``paths`` as ranks; a bad set gets a dialog and changes nothing."""
        try:
            window = RankWindow.from_files(paths if len(paths) > 1 else paths[0], self.window)
        except (TraceFileError, ValueError, OSError) as e:
            dialogs.show_error(self.window, "Cannot open ranks", str(e))
            return None
        dialogs.show_child_window(window, self.window, self.windows)
        return window


def attach(window) -> RanksLauncher:
    """Add File ▸ Open ranks… to the main window."""
    return RanksLauncher(window)


__all__ = ["RankWindow", "RanksLauncher", "attach", "is_rank_set", "open_ranks"]
