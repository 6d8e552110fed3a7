"""The step bar (bottom): debugger buttons, a slider, play speed, and where we are.

The bar holds no trace logic: it shows a position and emits what the user asked for.
``stepRequested(int)`` carries an absolute step index (slider, first, last, prev, next);
the named signals (``stepOverRequested``...) leave the rule to the window, which asks
``app.core.session``. Play advances one step per tick at ``speed`` steps per second.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import (
    QHBoxLayout,
    QSizePolicy,
    QSlider,
    QSpinBox,
    QStyle,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app import theme
from app.widgets.common import make_opaque, monospace_font
from app.widgets.phase_strip import PhaseStrip


class TextLine(QWidget):
    """One line of text that never asks its layout to move (it is set on every step).

    ``QLabel.setText`` re-runs the layout of every ancestor, which on a big window costs
    tens of milliseconds; this widget has a fixed height, elides what does not fit and
    only repaints itself.
    """

    BACKGROUND = QColor(theme.BAR_BACKGROUND)

    def __init__(self, parent: QWidget | None = None, colour: str = theme.TEXT, bold=False):
        super().__init__(parent)
        self._text = ""
        self.colour = QColor(colour)
        # opaque: a repaint stays inside this widget instead of repainting the window under it
        self.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)
        font = monospace_font()
        font.setBold(bold)
        self.setFont(font)
        self.setFixedHeight(self.fontMetrics().height() + 6)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def text(self) -> str:
        return self._text

    def setText(self, text: str) -> None:
        if text != self._text:
            self._text = text
            self.setToolTip(text)
            self.update()

    def set_colour(self, colour: str) -> None:
        if QColor(colour) != self.colour:
            self.colour = QColor(colour)
            self.update()

    def sizeHint(self) -> QSize:
        return QSize(200, self.fontMetrics().height() + 6)

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        painter.fillRect(event.rect(), self.BACKGROUND)
        painter.setPen(self.colour)
        rect = self.rect().adjusted(2, 0, -2, 0)
        text = self.fontMetrics().elidedText(self._text, Qt.TextElideMode.ElideRight, rect.width())
        painter.drawText(
            rect, int(Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft), text
        )
        painter.end()


class StepBar(QWidget):
    """first / prev / play / next / last, step over / out / next NaN, slider, status."""

    stepRequested = Signal(int)
    stepOverRequested = Signal()
    stepOutRequested = Signal()
    nextNonfiniteRequested = Signal()
    playingChanged = Signal(bool)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("stepBar")
        self._count = 0
        self._index = 0
        self._build_buttons()
        self._build_slider_and_speed()
        self._build_text()
        self.timer = QTimer(self)
        self.timer.timeout.connect(self._tick)
        self._on_speed(self.speed.value())
        self._lay_out()
        self.set_count(0)

    # ---- building

    def _button(self, name: str, icon, tip: str, slot) -> QToolButton:
        """A flat tool button: a standard icon (or ``icon`` as its text), a tip, a slot."""
        b = QToolButton(self)
        b.setObjectName(name)
        if isinstance(icon, str):
            b.setText(icon)
        else:
            b.setIcon(self.style().standardIcon(icon))
        b.setToolTip(tip)
        b.setAutoRaise(True)
        b.clicked.connect(slot)
        return b

    def _build_buttons(self) -> None:
        """first / prev / play / next / last, and step over / out / next NaN."""
        button = self._button
        SP = QStyle.StandardPixmap
        self.first_button = button(
            "first", SP.SP_MediaSkipBackward, "First step (Home)", self.first
        )
        self.prev_button = button(
            "prev", SP.SP_MediaSeekBackward, "Previous step (Left)", self.prev
        )
        self.play_button = button("play", SP.SP_MediaPlay, "Play / pause (Space)", self.toggle_play)
        self.next_button = button("next", SP.SP_MediaSeekForward, "Next step (Right)", self.next)
        self.last_button = button("last", SP.SP_MediaSkipForward, "Last step (End)", self.last)
        self.over_button = button(
            "stepOver",
            "Step over",
            "Skip the current module's internals (F10 or Down)",
            self.stepOverRequested.emit,
        )
        self.out_button = button(
            "stepOut",
            "Step out",
            "Run to the end of the enclosing module (Shift+F11 or Up)",
            self.stepOutRequested.emit,
        )
        self.nan_button = button(
            "nextNonfinite",
            "Next NaN/Inf",
            "Run to the next step holding NaN or Inf (N)",
            self.nextNonfiniteRequested.emit,
        )

    def _build_slider_and_speed(self) -> None:
        self.slider = QSlider(Qt.Orientation.Horizontal, self)
        self.slider.setObjectName("stepSlider")
        self.slider.setMinimum(0)
        self.slider.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.slider.valueChanged.connect(self._on_slider)
        self.slider.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        make_opaque(self.slider, TextLine.BACKGROUND)
        self.speed = QSpinBox(self)
        self.speed.setObjectName("speed")
        self.speed.setRange(1, 120)
        self.speed.setValue(8)
        self.speed.setSuffix(" steps/s")
        self.speed.setToolTip("Play speed")
        self.speed.valueChanged.connect(self._on_speed)

    def _build_text(self) -> None:
        """The status line, the current source line and the forward | backward strip."""
        self.status = TextLine(self, theme.TEXT, bold=True)
        self.status.setObjectName("stepStatus")
        self.status.setText("no trace")
        self.status.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.status.setMinimumWidth(self.status.fontMetrics().horizontalAdvance("x" * 64))
        self.source_line = TextLine(self, theme.TEXT_SHAPE)
        self.source_line.setObjectName("sourceLine")
        self.phases = PhaseStrip(self)  # forward | backward, for training-step traces

    def _lay_out(self) -> None:
        """Buttons, slider and speed on one row; the phases; status and source below."""
        controls = QHBoxLayout()
        controls.setSpacing(2)
        for b in (
            self.first_button,
            self.prev_button,
            self.play_button,
            self.next_button,
            self.last_button,
        ):
            controls.addWidget(b)
        controls.addSpacing(8)
        for b in (self.over_button, self.out_button, self.nan_button):
            controls.addWidget(b)
        controls.addSpacing(8)
        controls.addWidget(self.slider, 1)
        controls.addSpacing(8)
        controls.addWidget(self.speed)
        text = QHBoxLayout()
        text.setSpacing(16)
        text.addWidget(self.status)
        text.addWidget(self.source_line, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 6)
        layout.setSpacing(2)
        layout.addLayout(controls)
        layout.addWidget(self.phases)
        layout.addLayout(text)

    # ---- state

    @property
    def index(self) -> int:
        return self._index

    @property
    def playing(self) -> bool:
        return self.timer.isActive()

    def set_count(self, count: int) -> None:
        self.stop()
        self._count = count
        self.slider.blockSignals(True)
        self.slider.setMaximum(max(0, count - 1))
        self.slider.setValue(0)
        self.slider.blockSignals(False)
        for w in (
            self.first_button,
            self.prev_button,
            self.play_button,
            self.next_button,
            self.last_button,
            self.over_button,
            self.out_button,
            self.nan_button,
            self.slider,
        ):
            w.setEnabled(count > 0)
        if count == 0:
            self.status.setText("no trace")
            self.source_line.setText("")

    def set_phases(self, backward_start: int | None, count: int) -> None:
        """A training-step trace: steps from ``backward_start`` on are the backward phase."""
        self.phases.set_phases(backward_start, count)

    def set_position(self, index: int, status: str, source: str, error: str | None = None) -> None:
        """Show step ``index`` (called by the window after every move)."""
        self._index = index
        self.phases.set_index(index)
        if self.slider.value() != index:
            self.slider.blockSignals(True)
            self.slider.setValue(index)
            self.slider.blockSignals(False)
        self.status.setText(status)
        self.status.set_colour(theme.ERROR_TEXT if error else theme.TEXT)
        self.source_line.setText(f"✖ {error}" if error else source)
        self.source_line.set_colour(theme.ERROR_TEXT if error else theme.TEXT_SHAPE)

    # ---- moves

    def first(self) -> None:
        self.stepRequested.emit(0)

    def last(self) -> None:
        self.stepRequested.emit(max(0, self._count - 1))

    def prev(self) -> None:
        self.stepRequested.emit(max(0, self._index - 1))

    def next(self) -> None:
        self.stepRequested.emit(min(self._count - 1, self._index + 1))

    def _on_slider(self, value: int) -> None:
        self.stepRequested.emit(value)

    # ---- play

    def toggle_play(self) -> None:
        if self.playing:
            self.stop()
        else:
            self.play()

    def play(self) -> None:
        if self._count == 0:
            return
        if self._index >= self._count - 1:
            self.stepRequested.emit(0)
        self.timer.start()
        self.play_button.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_MediaPause))
        self.playingChanged.emit(True)

    def stop(self) -> None:
        if self.timer.isActive():
            self.timer.stop()
            self.playingChanged.emit(False)
        self.play_button.setIcon(self.style().standardIcon(QStyle.StandardPixmap.SP_MediaPlay))

    def _on_speed(self, steps_per_second: int) -> None:
        self.timer.setInterval(max(1, round(1000 / steps_per_second)))

    def _tick(self) -> None:
        if self._index >= self._count - 1:
            self.stop()
            return
        self.next()
