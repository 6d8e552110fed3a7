"""The look of the app: every colour it draws in, the stylesheet and the colour maps.

Colours are ``#rrggbb`` strings named by what they are for, so one constant serves painting
(``QColor(theme.BOX_FILL)``), rich text (``f"<span style='color:{theme.TEXT_MUTED}'>"``)
and ``style.qss``, whose ``$NAME`` placeholders :func:`stylesheet` fills from this module.
:func:`apply_theme` sets the Fusion style, the dark palette and that stylesheet.

A new widget takes its colours from here; a hex literal anywhere else in ``app/`` is a bug.
Importing this module loads no Qt (only :func:`apply_theme` needs it), so Qt-free code such
as the diagram's layout takes its colours from here too.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from PySide6.QtWidgets import QApplication

# ---- surfaces, darkest first
SOURCE_BACKGROUND = "#16181d"  # the source pane
BASE = "#181a1f"  # fields, lists, trees, tables
BAR_BACKGROUND = "#1a1c22"  # menu bar, tool bar, status bar, step bar
BACKGROUND = "#1b1d23"  # the diagram's canvas and the source gutter
ALTERNATE_ROW = "#1c1f25"
WINDOW = "#1f2229"
ALTERNATE_BASE = "#22252c"  # also the prompt chips of the generation timeline
MENU = "#23262e"
HOVER = "#242831"
BOX_FILL = "#262a33"  # a diagram box, a selected tab
BUTTON = "#2a2e37"
TOOLTIP = "#2b2f38"
RAISED = "#2c3039"  # a chip's probability track
TRACK = "#2f3440"  # a hovered menu-bar item or tool button, the slider's groove
BUTTON_HOVER = "#323744"
CURRENT_FILL = "#3a3424"  # the selected box or chip, warm like CURRENT
CURRENT_LINE = "#3d3522"  # the source line of the current step
FAILED_LINE = "#5c2326"  # the source line that raised (ERROR, darkened under text)

# ---- lines
DIVIDER = "#2c3039"  # between areas, separators
FIELD_BORDER = "#353a45"
BOX_BORDER = "#3a404d"  # a diagram box, menus, buttons, scroll handles
FRAME_BORDER = "#444b5a"  # an expanded module's frame, tooltips
EDGE = "#6b7385"  # a data-flow arrow
RESIDUAL_EDGE = "#7bd88f"  # a residual / skip path (drawn a shade darker)

# ---- text
TEXT = "#e6e9ef"  # headings, the diagram's titles, the step bar
BODY_TEXT = "#d7dae0"  # everything else
SOURCE_TEXT = "#c8ccd4"
TEXT_MUTED = "#9aa3b2"  # secondary facts: types, counts, hints in rich text
TEXT_FAINT = "#7f8898"  # pane titles, placeholders in rich text
TEXT_DIM = "#6b7385"  # the least important text, placeholders in fields
TEXT_DISABLED = "#5c6370"
TEXT_SHAPE = "#8fd3ff"  # shapes, code, links
TEXT_ON_LIGHT = "#111318"  # text over a light cell
TEXT_ON_DARK = "#f2f4f8"  # text over a dark cell
WHITE = "#ffffff"

# ---- state
SELECTION = "#3d5a80"
ACCENT = "#5f87b8"  # focus rings, progress, the slider's filled part, probability bars
CURRENT = "#ffb547"  # the current step, wherever it is shown
ERROR = "#ff5c5c"
ERROR_TEXT = "#ff7b7b"  # an error said in words (lighter, for reading)
NONFINITE = "#d62728"  # a NaN or Inf in a table cell
IO_ACCENT = "#c8ced8"  # the diagram's input and output boxes

# ---- training-step traces: the two phases, and boxes coloured by gradient norm
FORWARD_PHASE = "#2f4f7f"
BACKWARD_PHASE = "#7a4b1f"
GRAD_LOW = "#1f3f7a"  # box fill for the smallest gradient norm in view (vanishing)
GRAD_HIGH = "#8a2b2b"  # ... and for the largest (exploding)

# ---- the diagram's accent stripes: (keyword in the type or op name, colour)
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
OP_ACCENT = TEXT_FAINT  # an op no keyword matches

# ---- breakpoints: one colour per kind
BREAKPOINT_COLOURS = {
    "module": "#a98bff",
    "nonfinite": ERROR_TEXT,
    "abs": CURRENT,
    "entropy": "#4fd1c5",
    "op": "#5fa8ff",
    "grad": "#e5c07b",
}

# ---- shape table: inputs and outputs (matplotlib's first blue and green)
DIRECTION_COLOURS = {"in": "#1f77b4", "out": "#2ca02c"}

# ---- comparing two traces: identical, unknown, structural, and a green-to-red ramp
IDENTICAL = "#3fb68b"
NOT_COMPARED = EDGE
STRUCTURAL = "#ff5cc8"  # a changed shape, a step on one side only
DIVERGENCE_STOPS = (
    (0.0, IDENTICAL),
    (0.35, "#b5d66b"),
    (0.55, "#e5c07b"),
    (0.78, "#f08a4b"),
    (1.0, ERROR),
)

# ---- heatmap colour maps (pyqtgraph names)
SIGNED_CMAP = "CET-D1"  # blue - white - red, perceptually uniform, for data centred on 0
SIGNED_CMAP_DARK = "CET-D4"  # blue - black - red: the same idea for a dark theme
SEQUENTIAL_CMAP = "viridis"  # for non-negative data
PROBABILITY_CMAP = "inferno"  # for attention probabilities (0..1)
NAN_COLOUR = "#ff2bd6"  # heatmap cells that are NaN: hot magenta, in none of the maps we use
POSINF_COLOUR = "#39ff14"  # heatmap cells that are +Inf: neon green
NEGINF_COLOUR = "#00e5ff"  # heatmap cells that are -Inf: bright cyan
MASKED_COLOUR = "#8a93a6"  # heatmap cells that are mask fills (-1e9, -inf): a grey no map uses

_STYLESHEET = Path(__file__).with_name("style.qss")


def accent_for(name: str) -> str:
    """The accent stripe's colour for a module type or op name."""
    low = name.lower()
    for key, colour in ACCENTS:
        if key in low:
            return colour
    return OP_ACCENT


def stylesheet() -> str:
    """``style.qss`` with its ``$NAME`` placeholders replaced by this module's colours."""
    template = string.Template(_STYLESHEET.read_text(encoding="utf-8"))
    colours = {k: v for k, v in globals().items() if k.isupper() and isinstance(v, str)}
    return template.substitute(colours)


def apply_theme(app: QApplication) -> None:
    """Fusion style, the dark palette and :func:`stylesheet`."""
    # Qt is imported here, not at the top: the colours above are read by Qt-free modules
    # (the diagram's layout, tests/test_layering.py holds it), which must not load Qt.
    from PySide6.QtGui import QColor, QPalette

    app.setStyle("Fusion")
    palette = QPalette()
    roles = QPalette.ColorRole
    colours = {
        roles.Window: WINDOW,
        roles.WindowText: BODY_TEXT,
        roles.Base: BASE,
        roles.AlternateBase: ALTERNATE_BASE,
        roles.ToolTipBase: TOOLTIP,
        roles.ToolTipText: TEXT,
        roles.Text: BODY_TEXT,
        roles.Button: BUTTON,
        roles.ButtonText: BODY_TEXT,
        roles.BrightText: WHITE,
        roles.Highlight: SELECTION,
        roles.HighlightedText: WHITE,
        roles.Link: TEXT_SHAPE,
        roles.PlaceholderText: TEXT_DIM,
    }
    for role, colour in colours.items():
        palette.setColor(role, QColor(colour))
    for role in (roles.WindowText, roles.Text, roles.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(TEXT_DISABLED))
    app.setPalette(palette)
    if _STYLESHEET.is_file():
        app.setStyleSheet(stylesheet())
