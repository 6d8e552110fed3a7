"""Dialogs: the new-trace form, one helper every error goes through, and the base of the
File-menu actions that open trace files in windows of their own (:class:`FileMenuLauncher`).

Tests replace :func:`show_error` (``monkeypatch.setattr(app.windows.dialogs, "show_error", ...)``);
so the window always calls it as ``dialogs.show_error(...)``, never through a copied name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QTimer
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QProgressDialog,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

import tracing
from app.core.model_sources import DEVICES, MODEL_HELP
from app.core.session import DEFAULT_CAPTURE, PRESETS, CheckedValues, ModelSource, TraceRequest
from app.widgets.common import hint_label

#: the file dialogs' filter for trace files (``.sft`` is the suffix the README uses)
TRACE_FILTER = "Trace files (*.sft *.safetensors *.sftrace *.trace);;All files (*)"


def show_child_window(window: QWidget, parent: QWidget | None, keep: list | None = None) -> None:
    """Show ``window`` as a window of its own, owned by ``parent`` and deleted when closed;
    ``keep`` (a list its launcher owns) holds it until then."""
    if parent is not None:
        window.setWindowFlag(Qt.WindowType.Window, True)
        window.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)
    if keep is not None:
        keep.append(window)

        def forget(_obj=None) -> None:
            if window in keep:
                keep.remove(window)

        window.destroyed.connect(forget)
    window.show()


class FileMenuLauncher(QObject):
    """A File-menu action of the main window that opens trace files in windows of their own.

    A subclass gives the action's text, tip and place and implements ``open_dialog``
    (usually :meth:`ask_for_files`, then its own ``open_with``); the windows it opens are
    kept in ``windows`` until they close (see :func:`show_child_window`).
    """

    def __init__(self, window, text: str, tip: str, *, after, shortcut: str | None = None):
        super().__init__(window)
        self.window = window
        self.windows: list[QWidget] = []
        self.action = QAction(text, window)
        if shortcut:
            self.action.setShortcut(QKeySequence(shortcut))
        self.action.setStatusTip(tip)
        self.action.triggered.connect(lambda _checked=False: self.open_dialog())
        window.add_menu_action("File", self.action, after=after)

    def open_dialog(self) -> None:
        raise NotImplementedError

    def ask_for_files(self, title: str, *, many: bool = False) -> list[Path]:
        """The trace files the user picks in a file dialog (none when cancelled)."""
        start = self.window.start_dir()
        if many:
            paths, _ = QFileDialog.getOpenFileNames(self.window, title, start, TRACE_FILTER)
        else:
            path, _ = QFileDialog.getOpenFileName(self.window, title, start, TRACE_FILTER)
            paths = [path] if path else []
        return [Path(p) for p in paths]


def warn_on_unreadable_values(parent: QWidget, trace, owner: bool = True) -> None:
    """When a value of ``trace`` cannot be read from its file later (changed on disk,
    corrupt), show one dialog per trace, after the current event, naming the problem;
    the value then reads as not kept (``session.CheckedValues``). ``owner=False`` leaves
    a trace that already reports somewhere (the main window's, shown in a compare
    window) as it is."""
    values = trace.values
    if isinstance(values, dict):  # in memory: nothing to read from disk
        return
    if not isinstance(values, CheckedValues):
        trace.values = values = CheckedValues(values)
    if values.on_error is not None and not owner:
        return
    shown = False

    def on_error(message: str) -> None:
        nonlocal shown
        if shown:
            return
        shown = True
        text = (
            f"{message}\n\nValues that cannot be read are shown as not kept. If the file "
            "was replaced or rewritten, open it again."
        )
        QTimer.singleShot(0, lambda: show_error(parent, "Cannot read a value", text))

    values.on_error = on_error


def show_error(parent: QWidget | None, title: str, text: str, details: str = "") -> None:
    """A modal error box naming the problem; ``details`` (a traceback) goes under a button."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Critical)
    box.setWindowTitle(title)
    box.setText(text)
    if details:
        box.setDetailedText(details)
    box.exec()


def show_info(parent: QWidget | None, title: str, text: str) -> None:
    QMessageBox.information(parent, title, text)


def cancellable_progress(
    parent: QWidget, label: str, title: str, maximum: int, on_cancel: Callable[[], None]
) -> QProgressDialog:
    """A window-modal progress dialog for a background job; Cancel calls ``on_cancel``.

    It shows only if the job takes longer than 0.4 s, and stays up until
    :func:`close_progress` (no auto close or reset when the value reaches the maximum).
    """
    progress = QProgressDialog(label, "Cancel", 0, maximum, parent)
    progress.setWindowTitle(title)
    progress.setWindowModality(Qt.WindowModality.WindowModal)
    progress.setMinimumDuration(400)
    progress.setAutoClose(False)
    progress.setAutoReset(False)
    progress.setValue(0)
    progress.canceled.connect(on_cancel)
    return progress


def close_progress(progress: QProgressDialog | None) -> None:
    """Take down a dialog made by :func:`cancellable_progress` (``None`` is fine)."""
    if progress is not None:
        progress.reset()
        progress.hide()
        progress.deleteLater()


def lay_out_form(dialog: QDialog, rows: list[tuple[str, QWidget]], ok_text: str) -> None:
    """Give ``dialog`` the house layout: labelled rows, then OK (named ``ok_text``) / Cancel."""
    form = QFormLayout()
    for label, widget in rows:
        form.addRow(label, widget)
    buttons = QDialogButtonBox(
        QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, dialog
    )
    buttons.button(QDialogButtonBox.StandardButton.Ok).setText(ok_text)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    layout = QVBoxLayout(dialog)
    layout.addLayout(form)
    layout.addWidget(buttons)


class NewTraceDialog(QDialog):
    """Prompt, model (bundled demo, a preset with random weights, a checkpoint, or the
    user's own ``FILE.py:NAME`` with an input shape), capture."""

    def __init__(self, parent: QWidget | None = None, prompt: str = ""):
        super().__init__(parent)
        self.setWindowTitle("New trace")
        self.setMinimumWidth(520)
        self.prompt_edit = QPlainTextEdit(self)
        self.prompt_edit.setPlaceholderText("Text to feed the model…")
        self.prompt_edit.setPlainText(prompt)
        self.prompt_edit.setFixedHeight(80)
        source = self._build_source()
        self._build_capture()
        lay_out_form(
            self,
            [
                ("Prompt", self.prompt_edit),
                ("Model", _wrap(source)),
                ("Capture", self.capture_combo),
                ("", self.capture_hint),
                ("", self.training_check),
            ],
            ok_text="Trace",
        )
        self.preset_combo.currentIndexChanged.connect(lambda _i: self.preset_radio.setChecked(True))
        self.checkpoint_edit.textEdited.connect(lambda _t: self.checkpoint_radio.setChecked(True))
        for edit in (self.model_edit, self.shape_edit):
            edit.textEdited.connect(lambda _t: self.file_radio.setChecked(True))

    def _build_source(self) -> QGridLayout:
        """Where the model comes from: demo, preset, checkpoint, or the user's own file."""
        self.demo_radio = QRadioButton("Bundled demo model", self)
        self.preset_radio = QRadioButton("Preset with random weights", self)
        self.checkpoint_radio = QRadioButton("Checkpoint file", self)
        self.file_radio = QRadioButton("Your model", self)
        self.demo_radio.setChecked(True)
        group = QButtonGroup(self)
        for b in (self.demo_radio, self.preset_radio, self.checkpoint_radio, self.file_radio):
            group.addButton(b)
        self.preset_combo = QComboBox(self)
        self.preset_combo.addItems(PRESETS)
        self.checkpoint_edit = QLineEdit(self)
        self.checkpoint_edit.setPlaceholderText("path/to/model.safetensors")
        browse = QPushButton("Browse…", self)
        browse.clicked.connect(self._browse)
        source = QGridLayout()
        source.addWidget(self.demo_radio, 0, 0, 1, 3)
        source.addWidget(self.preset_radio, 1, 0)
        source.addWidget(self.preset_combo, 1, 1, 1, 2)
        source.addWidget(self.checkpoint_radio, 2, 0)
        source.addWidget(self.checkpoint_edit, 2, 1)
        source.addWidget(browse, 2, 2)
        self.model_edit = QLineEdit(self)
        self.model_edit.setPlaceholderText(
            "model.py:MyModel, a Hugging Face folder, or a config.json"
        )
        self.model_edit.setToolTip(MODEL_HELP)
        browse_model = QPushButton("Browse…", self)
        browse_model.clicked.connect(self._browse_model)
        browse_folder = QPushButton("Folder…", self)
        browse_folder.setToolTip("a Hugging Face model folder (config.json + safetensors)")
        browse_folder.clicked.connect(self._browse_model_folder)
        self.device_combo = QComboBox(self)
        self.device_combo.addItems(DEVICES)
        self.device_combo.setToolTip("where the model is built and run (meta: shapes only)")
        self.shape_edit = QLineEdit(self)
        self.shape_edit.setPlaceholderText("input shape, e.g. 2,10 (empty: the prompt's bytes)")
        self.dtype_combo = QComboBox(self)
        self.dtype_combo.addItems(("long", "float"))
        source.addWidget(self.file_radio, 3, 0)
        source.addWidget(self.model_edit, 3, 1)
        source.addWidget(browse_model, 3, 2)
        source.addWidget(browse_folder, 3, 3)
        source.addWidget(self.shape_edit, 4, 1)
        source.addWidget(self.dtype_combo, 4, 2)
        source.addWidget(self.device_combo, 4, 3)
        return source

    def _build_capture(self) -> None:
        """What to keep per tensor, and whether to record a training step."""
        self.capture_combo = QComboBox(self)
        self.capture_combo.addItems(tracing.CAPTURE_LEVELS)
        self.capture_combo.setCurrentText(DEFAULT_CAPTURE)
        self.capture_hint = hint_label(
            "shapes: cheapest · stats: min/max/mean/std, NaN/Inf · values: copies for heatmaps",
            wrap=True,
        )
        self.training_check = QCheckBox(
            "Training step: forward, next-token cross-entropy on the prompt, backward", self
        )
        self.training_check.setObjectName("trainingStep")
        self.training_check.setToolTip(
            "Also record the backward pass: a step per autograd node, every gradient"
        )

    def _browse_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Model file", "", "Python (*.py);;Hugging Face config (*.json)"
        )
        if path.endswith(".json"):
            self.model_edit.setText(path)
            self.file_radio.setChecked(True)
        elif path:
            name = self.model_edit.text().rpartition(":")[2] or "Model"
            self.model_edit.setText(f"{path}:{name}")
            self.file_radio.setChecked(True)

    def _browse_model_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Hugging Face model folder")
        if path:
            self.model_edit.setText(path)
            self.file_radio.setChecked(True)

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Checkpoint", "", "Checkpoints (*.safetensors);;All files (*)"
        )
        if path:
            self.checkpoint_edit.setText(path)
            self.checkpoint_radio.setChecked(True)

    def request(self) -> TraceRequest:
        """What the user asked for (validation happens in ``app.core.session``)."""
        if self.file_radio.isChecked():
            source = ModelSource(
                "file",
                model=self.model_edit.text().strip(),
                input_shape=self.shape_edit.text().strip(),
                input_dtype=self.dtype_combo.currentText(),
                device=self.device_combo.currentText(),
            )
        elif self.checkpoint_radio.isChecked():
            source = ModelSource("checkpoint", checkpoint=self.checkpoint_edit.text().strip())
        elif self.preset_radio.isChecked():
            source = ModelSource("preset", preset=self.preset_combo.currentText())
        else:
            source = ModelSource("demo")
        return TraceRequest(
            prompt=self.prompt_edit.toPlainText(),
            source=source,
            capture=self.capture_combo.currentText(),
            training=self.training_check.isChecked(),
        )


def _wrap(layout) -> QWidget:
    w = QWidget()
    w.setLayout(layout)
    layout.setContentsMargins(0, 0, 0, 0)
    return w
