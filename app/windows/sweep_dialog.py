"""Edit ▸ Patching sweep…: which heads, blocks or positions carry the answer.

Two prompts of the same length (clean and corrupted), what one run patches (heads, layers,
positions), Run: the live model runs the corrupted prompt once per site with that site taken
from the clean run (``tracing.patching.sweep``, off the GUI thread, with a cancellable
progress dialog), and the table shows as a heatmap (``app.widgets.sweep_heatmap``). The
result saves as CSV or PNG.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.core import edit_session
from app.core.session import TraceRequest
from app.widgets.sweep_heatmap import SweepHeatmap, sweep_image
from app.windows import dialogs
from app.workers import BackgroundJob, JobWithProgress


class SweepDialog(QDialog):
    """Set up, run and show one patching sweep of the window's live model."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("sweepDialog")
        self.setWindowTitle("Patching sweep — Scratchformer")
        self.resize(820, 560)
        self.request: TraceRequest | None = None
        self.result = None
        self.job: JobWithProgress | None = None

        self.clean_edit = QLineEdit()
        self.corrupted_edit = QLineEdit()
        self.corrupted_edit.setPlaceholderText("the clean prompt with one token changed")
        self.over_combo = QComboBox()
        self.over_combo.addItems(["heads", "layers", "positions"])
        form = QFormLayout()
        form.addRow("Clean prompt", self.clean_edit)
        form.addRow("Corrupted prompt", self.corrupted_edit)
        form.addRow("Patch one", self.over_combo)
        self.run_button = QPushButton("Run sweep ▶")
        self.run_button.setObjectName("runSweep")
        self.run_button.clicked.connect(lambda: self.run())
        self.csv_button = QPushButton("Save CSV…")
        self.png_button = QPushButton("Save PNG…")
        self.csv_button.clicked.connect(self._save_csv_dialog)
        self.png_button.clicked.connect(self._save_png_dialog)
        buttons = QHBoxLayout()
        buttons.addWidget(self.csv_button)
        buttons.addWidget(self.png_button)
        buttons.addStretch(1)
        buttons.addWidget(self.run_button)
        self.heatmap = SweepHeatmap()
        scroll = QScrollArea()
        scroll.setWidget(self.heatmap)
        scroll.setWidgetResizable(True)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(scroll, 1)
        self._set_result(None)

    def set_request(self, request: TraceRequest) -> None:
        """The live model and the prompt to start from."""
        self.request = request
        if not self.clean_edit.text():
            self.clean_edit.setText(request.prompt)

    def sweep_request(self) -> edit_session.SweepRequest:
        assert self.request is not None
        return edit_session.SweepRequest(
            self.request,
            self.clean_edit.text(),
            self.corrupted_edit.text(),
            self.over_combo.currentText(),
        )

    def run(self, background: bool = True) -> bool:
        if self.request is None or self.job is not None:
            return False
        request = self.sweep_request()
        if not request.corrupted:
            dialogs.show_error(self, "Cannot sweep", "Type a corrupted prompt (same length).")
            return False
        if not background:
            try:
                self._set_result(edit_session.run_sweep(request))
            except edit_session.SessionError as e:
                dialogs.show_error(self, "Cannot sweep", str(e))
                return False
            return True
        job = BackgroundJob(
            request,
            edit_session.run_sweep,
            refused_title="Cannot sweep",
            failed_title="The sweep failed",
        )
        self.job = JobWithProgress(
            self,
            job,
            "Patching…",
            "Patching sweep",
            self._on_finished,
            self._on_failed,
            lambda done, total: f"Patched run {done} of {total}",
        )
        return True

    def _on_finished(self, result) -> None:
        self.job = None
        self._set_result(result)

    def _on_failed(self, title: str, text: str) -> None:
        self.job = None
        dialogs.show_error(self, title, text)

    def _set_result(self, result) -> None:
        self.result = result
        title = ""
        if result is not None:
            title = f"patch {self.corrupted_edit.text()!r} with {self.clean_edit.text()!r}"
        self.heatmap.set_result(result, title)
        self.heatmap.setMinimumSize(self.heatmap.sizeHint())
        self.csv_button.setEnabled(result is not None)
        self.png_button.setEnabled(result is not None)

    # ---- saving

    def save_csv(self, path: str | Path) -> None:
        Path(path).write_text(self.result.to_csv())

    def save_png(self, path: str | Path) -> None:
        if not sweep_image(self.result, self.heatmap.title).save(str(path), "PNG"):
            raise OSError(f"cannot write {path}")

    def _save_csv_dialog(self) -> None:
        self._save_dialog("sweep.csv", "CSV (*.csv)", self.save_csv)

    def _save_png_dialog(self) -> None:
        self._save_dialog("sweep.png", "PNG image (*.png)", self.save_png)

    def _save_dialog(self, default: str, filters: str, write) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save sweep", default, filters)
        if path:
            self.save_checked(path, write)

    def save_checked(self, path: str | Path, write) -> bool:
        """``write(path)`` unless ``path`` is a file the model was read from or lies in
        its folder (the command line's rule); a dialog says why it was not written."""
        from app.commands.checks import PathProblem, output_file

        inputs = self.request.source.reads() if self.request is not None else []
        try:
            output_file(path, inputs=inputs)
            write(path)
        except (OSError, PathProblem) as e:
            dialogs.show_error(self, "Cannot save", str(e))
            return False
        return True

    def closeEvent(self, event) -> None:
        if self.job is not None:
            self.job.job.cancel()
            self.job.job.wait(10_000)
        super().closeEvent(event)


__all__ = ["SweepDialog"]
