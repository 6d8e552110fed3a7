"""The look of the app: the colours everything is drawn in and the application style.

:func:`apply_theme` sets the Fusion style, a dark palette and ``app/style.qss``; the
constants below are the diagram's colours, shared with the panels that echo it.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

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


def accent_for(name: str) -> QColor:
    low = name.lower()
    for key, colour in ACCENTS:
        if key in low:
            return QColor(colour)
    return QColor(OP_ACCENT)


def apply_theme(app: QApplication) -> None:
    """Fusion style, a dark palette and ``app/style.qss``."""
    app.setStyle("Fusion")
    palette = QPalette()
    colours = {
        QPalette.ColorRole.Window: "#1f2229",
        QPalette.ColorRole.WindowText: "#d7dae0",
        QPalette.ColorRole.Base: "#181a1f",
        QPalette.ColorRole.AlternateBase: "#22252c",
        QPalette.ColorRole.ToolTipBase: "#2b2f38",
        QPalette.ColorRole.ToolTipText: "#e6e9ef",
        QPalette.ColorRole.Text: "#d7dae0",
        QPalette.ColorRole.Button: "#2a2e37",
        QPalette.ColorRole.ButtonText: "#d7dae0",
        QPalette.ColorRole.BrightText: "#ffffff",
        QPalette.ColorRole.Highlight: "#3d5a80",
        QPalette.ColorRole.HighlightedText: "#ffffff",
        QPalette.ColorRole.Link: "#8fd3ff",
        QPalette.ColorRole.PlaceholderText: "#6b7385",
    }
    for role, colour in colours.items():
        palette.setColor(role, QColor(colour))
    for role in (
        QPalette.ColorRole.WindowText,
        QPalette.ColorRole.Text,
        QPalette.ColorRole.ButtonText,
    ):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor("#5c6370"))
    app.setPalette(palette)
    qss = Path(__file__).with_name("style.qss")
    if qss.is_file():
        app.setStyleSheet(qss.read_text(encoding="utf-8"))
