"""A matrix on screen: ``HeatmapView``, one pyqtgraph image with labelled axes and a colour bar.

Every picture in the inspector (a tensor slice, an attention map) is a ``HeatmapView``. It
shows one 2-D array the way a person reads a matrix:

- **Row-major, row 0 on top.** pyqtgraph images are column-major unless told otherwise, so
  the image item is built with ``axisOrder="row-major"`` (``image[r, c]`` is drawn at x = c,
  y = r) and the view is ``invertY``-ed so that row 0 is the top row, like a printed matrix.
- **Index coordinates.** Pixel ``(r, c)`` covers ``[c, c + 1) x [r, r + 1)`` in view units, so
  axis ticks, hover and zoom all speak in tensor indices, also when a huge matrix is
  downsampled for display (the image rectangle keeps the full size; only pixels get fewer).
- **Token labels.** Rows or columns that run over time (``T``) can carry the prompt's tokens
  as tick labels (``AxisItem.setTicks``). Only the labels that fit are handed to the axis:
  every token when there is room, else every 2nd, 4th, 8th ... recomputed when the view is
  zoomed, panned or resized, so 256 tokens never mean 256 labels measured on every paint.
  Column labels too wide to sit side by side turn upright (:class:`TokenAxisItem`), so a
  column a line wide is room enough.
- **On the map.** The view's range is the matrix, at any widget size; square cells
  (attention maps) come from margins around the plot, not from widening the range.
- **Honest colours.** Signed data gets a diverging map centred on zero (blue < 0 < red);
  non-negative data and probabilities get a sequential map (viridis, inferno for attention).
- **Hover** shows ``(row, col) = value`` from the full-resolution matrix, in a line under
  the plot and as a tooltip; stepping to another matrix under a still mouse reads the
  new value there.

The widget keeps one ``ImageItem`` for its whole life: stepping through a trace only swaps
the pixels, which keeps a step update to a few milliseconds.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import pyqtgraph as pg
import torch
from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QFontMetrics, QImage, QPainter, QPalette
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QStackedLayout,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from app.theme import (
    MASKED_COLOUR,
    PROBABILITY_CMAP,
    SEQUENTIAL_CMAP,
    SIGNED_CMAP,
    SIGNED_CMAP_DARK,
)
from app.widgets.common import ElidedLabel
from app.widgets.masked_cells import masked_cells
from app.widgets.nonfinite_cells import nonfinite_cells

Scale = Literal["auto", "signed", "sequential", "probability"]

MAX_DISPLAY = 768
"""Largest number of pixels per axis handed to the image; bigger matrices are strided."""

PLOT_MARGINS = (4, 4, 4, 12)
"""Space around the plot (left, top, right, bottom), pixels; square maps add to it."""

MASKED_ARGB = 0xFF000000 | int(MASKED_COLOUR[1:], 16)
"""The mask-fill colour as the premultiplied ARGB word ``ColouredImageItem`` writes."""


def display_stride(n: int, limit: int = MAX_DISPLAY) -> int:
    """How many indices one displayed pixel stands for along an axis of length ``n``."""
    return max(1, math.ceil(n / limit))


def token_every(visible: float, pixels: float, label_pixels: float) -> int:
    """Label every n-th token (n a power of two) so labels are ``label_pixels`` apart."""
    if visible <= 0 or pixels <= 0:
        return 1
    every = 1
    while every * pixels / visible < label_pixels and every < 1 << 20:
        every *= 2
    return every


def token_ticks(
    labels: Sequence[str], first: float = 0, last: float | None = None, every: int = 1
) -> list[list[tuple[float, str]]]:
    """Ticks for ``AxisItem.setTicks``: every ``every``-th label with index in [first, last],
    at the centre (i + 0.5) of its index. One level: what fits is decided by the caller."""
    n = len(labels)
    last = n if last is None else last
    start = max(0, math.floor(first) // every * every)
    stop = min(n, math.ceil(last) + 1)
    return [[(i + 0.5, labels[i]) for i in range(start, stop, every)]]


def colormap(name: str) -> pg.ColorMap:
    """The pyqtgraph colour map called ``name`` (the theme's ``*_CMAP``), built once."""
    cmap = _CMAP_CACHE.get(name)
    if cmap is None:
        cmap = _CMAP_CACHE[name] = pg.colormap.get(name)
    return cmap


_CMAP_CACHE: dict[str, pg.ColorMap] = {}


def nice_ceiling(x: float) -> float:
    """The smallest of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 (x 10^k) that is >= ``x`` > 0.

    Colour ranges end on such numbers, so the colour bar shows a round top value and
    stays put (no re-layout) while stepping through tensors of similar range.
    """
    if not math.isfinite(x) or x <= 0:
        return 1.0
    scale = 10.0 ** math.floor(math.log10(x))
    for mantissa in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if mantissa * scale >= x * (1 - 1e-9):
            return mantissa * scale
    return 10 * scale  # pragma: no cover - the loop always returns


def choose_levels(data: np.ndarray, scale: Scale) -> tuple[str, tuple[float, float]]:
    """Pick the colour map and level range for ``data`` (which may hold NaN, never Inf).

    ``"auto"`` means: sequential for data that never goes below zero, diverging and
    symmetric around zero otherwise, so white always means exactly 0. Symmetric and
    probability ranges end on a round number (``nice_ceiling``).
    """
    finite = data[np.isfinite(data)] if np.isnan(data).any() else data
    lo = float(finite.min()) if finite.size else 0.0
    hi = float(finite.max()) if finite.size else 0.0
    if scale == "probability":
        return PROBABILITY_CMAP, (0.0, nice_ceiling(hi))
    if scale == "sequential" or (scale == "auto" and lo >= 0):
        if hi <= lo:
            lo, hi = lo - 0.5, lo + 0.5
        return SEQUENTIAL_CMAP, (lo, hi)
    return SIGNED_CMAP, (-nice_ceiling(max(abs(lo), abs(hi))), nice_ceiling(max(abs(lo), abs(hi))))


COLOUR_SCALES: dict[str, str] = {
    "linear": "linear",
    "log": "log",
    "row": "per row",
    "percentile": "1–99th percentile",
}
"""How values map to colours; each view remembers its own choice (``HeatmapView.scale_key``)."""


def apply_colour_scale(
    data: np.ndarray, mode: str, levels: tuple[float, float], signed: bool
) -> tuple[np.ndarray, tuple[float, float], str]:
    """``(pixels, levels, what the colour bar means)`` for colour scale ``mode``.

    ``log``: log10 of the values (non-negative data; the smallest shown is a millionth of the
    largest) or, for signed data, sign · log10(1 + |x| / t) with t a thousandth of max |x|.
    ``row``: each row divided by its own largest |value|, so every row uses the whole range.
    ``percentile``: the range from the 1st to the 99th percentile (± the 99th of |x| for
    signed data); values beyond it take the end colours. Hover still shows the real value.
    """
    finite = data[np.isfinite(data)]
    if mode == "linear" or finite.size == 0:
        return data, levels, ""
    top = float(np.abs(finite).max())
    if top == 0:
        return data, levels, ""
    if mode == "log":
        if not signed:
            floor = max(float(finite[finite > 0].min()) if (finite > 0).any() else top, top * 1e-6)
            out = np.log10(np.clip(data, floor, None))
            return out, (math.log10(floor), math.log10(top)), "log₁₀ of the value"
        t = top * 1e-3
        out = np.sign(data) * np.log10(1 + np.abs(data) / t)
        end = math.log10(1 + top / t)
        return out, (-end, end), "sign · log₁₀(1 + |x| / t), t = max|x| / 1000"
    if mode == "row":
        with np.errstate(invalid="ignore", divide="ignore"):
            row_max = np.nanmax(np.where(np.isfinite(data), np.abs(data), np.nan), axis=1)
            out = data / np.where(row_max > 0, row_max, 1.0)[:, None]
        return out, ((-1.0, 1.0) if signed else (0.0, 1.0)), "each row ÷ its largest |value|"
    if mode == "percentile":
        if signed:
            hi = float(np.percentile(np.abs(finite), 99)) or top
            return data, (-hi, hi), "± 99th percentile of |x|"
        lo, hi = (float(v) for v in np.percentile(finite, [1, 99]))
        if hi <= lo:
            hi = lo + (top or 1.0) * 1e-6
        return data, (lo, hi), "1st to 99th percentile"
    raise ValueError(f"unknown colour scale {mode!r}; one of {', '.join(COLOUR_SCALES)}")


def _as_numpy(matrix: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(matrix, torch.Tensor):
        t = matrix.detach()
        if t.dtype != torch.float32:
            t = t.to(torch.float32)
        return t.cpu().numpy()
    return np.asarray(matrix, dtype=np.float32)


# --------------------------------------------------------------------------- axes


class CachedAxisItem(pg.AxisItem):
    """An ``AxisItem`` that keeps the pictures it drew and replays them when they fit again.

    pyqtgraph throws an axis's picture away whenever its range or ticks are set, and
    drawing a new one (choosing tick values, laying out each label) costs a few
    milliseconds. Stepping through a trace shows the same few shapes and colour ranges
    over and over, so the last ``PICTURES_KEPT`` pictures are kept, keyed by everything
    a picture depends on (range, ticks, geometry, text space, pens, style), and a step
    that comes back to a known axis only replays it.
    """

    PICTURES_KEPT = 64

    def __init__(self, orientation: str, **kwargs):
        super().__init__(orientation, **kwargs)
        self._pictures: OrderedDict[tuple, object] = OrderedDict()
        self.enableAutoSIPrefix(False)  # no units here; SI prefixes only re-set the label

    def picture_key(self) -> tuple:
        """Everything the axis picture depends on, as a hashable tuple."""
        levels = self._tickLevels
        ticks = None if levels is None else tuple(tuple(level) for level in levels)
        view = self.linkedView()
        grid_rect = (
            view.mapRectToItem(self, view.boundingRect()).getRect()
            if self.grid is not False and view is not None
            else None
        )
        return (
            tuple(self.range),
            ticks,
            self.mapRectFromParent(self.geometry()).getRect(),
            grid_rect,
            self.grid,
            self.textWidth,
            self.textHeight,
            self.scale,
            self.logMode,
            self.autoSIPrefixScale,
            self.pen().color().rgba(),
            self.textPen().color().rgba(),
            self.tickPen().color().rgba(),
            repr(sorted(self.style.items())),
        )

    def paint(self, p, opt, widget) -> None:
        if self.picture is None:
            key = self.picture_key()
            picture = self._pictures.get(key)
            if picture is None:
                super().paint(p, opt, widget)  # draws, and leaves the new picture behind
                if self.picture is not None:
                    self._pictures[key] = self.picture
                    if len(self._pictures) > self.PICTURES_KEPT:
                        self._pictures.popitem(last=False)
                return
            self._pictures.move_to_end(key)
            self.picture = picture
        self.picture.play(p)


class TokenAxisItem(CachedAxisItem):
    """The column axis: token labels across, or turned upright when they do not fit.

    A label across needs its text's width; upright it needs only a line's height. So when
    the labels handed over (``setTicks``) would overlap across, :meth:`set_upright` turns
    them to read bottom to top, one per column, and the axis grows as tall as the longest
    (:data:`UPRIGHT_MAX_PIXELS` at most, longer ones elided). Numbers stay across.
    """

    UPRIGHT_MAX_PIXELS = 120

    def __init__(self, orientation: str, **kwargs):
        super().__init__(orientation, **kwargs)
        self.upright = False
        self._room = 0  # pixels for an upright label (longer ones are elided)

    def set_upright(self, upright: bool, tallest: int = 0) -> None:
        """Turn the labels upright (``tallest``: the longest one's width in pixels) or back."""
        self._room = min(tallest, self.UPRIGHT_MAX_PIXELS)
        name = int(self.label.boundingRect().height() * 0.8) if self.label.isVisible() else 0
        height = self._room + 10 + name if upright else None  # the axis name on top
        if upright == self.upright and height == self.fixedHeight:
            return
        self.upright = upright
        self.setHeight(height)  # None: back to pyqtgraph's own height
        self.picture = None
        self.update()

    def picture_key(self) -> tuple:
        return (*super().picture_key(), self.upright)

    def generateDrawSpecs(self, p):
        specs = super().generateDrawSpecs(p)
        if not self.upright or specs is None or not self._tickLevels:
            return specs
        axis_spec, tick_specs, _ = specs
        lo, hi = self.range
        width = self.mapRectFromParent(self.geometry()).width()
        bottom = self.mapRectFromParent(self.geometry()).height() - 4
        metrics = QFontMetrics(p.font())
        line = metrics.height()
        room = self._room + 2
        texts = []  # (the upright label's rectangle, flags, text), as pyqtgraph's specs
        for x, label in (tick for level in self._tickLevels for tick in level):
            if hi <= lo or not lo <= x <= hi:
                continue
            at = (x - lo) / (hi - lo) * width
            shown = metrics.elidedText(label, Qt.TextElideMode.ElideRight, room)
            length = metrics.horizontalAdvance(shown)
            rect = QRectF(at - line / 2, bottom - length, line, length)
            texts.append((rect, int(Qt.AlignmentFlag.AlignLeft), shown))
        return axis_spec, tick_specs, texts

    def drawPicture(self, p, axisSpec, tickSpecs, textSpecs):
        if not self.upright:
            super().drawPicture(p, axisSpec, tickSpecs, textSpecs)
            return
        super().drawPicture(p, axisSpec, tickSpecs, [])
        p.setPen(self.textPen())
        for rect, flags, text in textSpecs:
            p.save()
            p.translate(rect.center().x(), rect.bottom())
            p.rotate(-90)  # reads bottom to top, centred on its column
            p.drawText(QRectF(0, -rect.width() / 2, rect.height(), rect.width()), flags, text)
            p.restore()


# --------------------------------------------------------------------------- image


class ColouredImageItem(pg.ImageItem):
    """An ``ImageItem`` that colours its float matrix itself, at about screen resolution.

    pyqtgraph turns a float image into an 8-bit *indexed* ``QImage`` whose colour table Qt
    converts on every paint, then scales the whole matrix onto the screen. Here, once per
    change, the matrix is first thinned to about one value per screen pixel (a 768-wide
    tensor on a 380-pixel plot keeps every 2nd column — the columns nearest-neighbour
    scaling would have picked anyway; zooming in brings every column back) and then goes
    through the colour map's lookup table in numpy, straight into a premultiplied 32-bit
    image, the format Qt draws fastest. NaN pixels stay transparent. Anything else (RGB
    data, a callable lookup table) takes pyqtgraph's own path.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.setAutoDownsample(True)  # pyqtgraph re-renders when zooming changes the factors
        self._lut32: tuple = (None, None)  # (pyqtgraph's lut, the same as uint32 ARGB)
        self._pixels: np.ndarray | None = None  # the QImage's buffer, kept alive with it
        self.masked: np.ndarray | None = None  # cells drawn in MASKED_ARGB (the image's shape)
        self.nonfinite = None  # NonFiniteCells: NaN, +Inf, -Inf in their colours, over all

    def render(self) -> None:
        image, lut, levels = self.image, self.lut, self.levels
        if (
            image is None
            or image.ndim != 2
            or image.dtype.kind != "f"
            or not isinstance(lut, np.ndarray)
            or levels is None
            or np.ndim(levels) != 1
        ):
            self._pixels = None
            super().render()
            return
        self._unrenderable = True
        if image.size == 0:
            return
        x_step, y_step = self._computeDownsampleFactors()
        if x_step is None:
            return
        self._lastDownsample = (x_step, y_step)
        shown = image[::y_step, ::x_step] if x_step > 1 or y_step > 1 else image  # (rows, cols)

        lo, hi = float(levels[0]), float(levels[1])
        scale = 256.0 / (hi - lo) if hi > lo else 0.0
        codes = np.subtract(shown, lo, dtype=np.float32)
        codes *= scale
        np.clip(codes, 0, 255, out=codes)
        nan = np.isnan(codes) if np.isnan(codes.min()) else None
        if nan is not None:
            codes[nan] = 0
        # C order whatever the input's layout (a transposed matrix gives Fortran order,
        # and QImage needs rows contiguous in memory)
        pixels = np.ascontiguousarray(self._argb_table(lut)[codes.astype(np.uint8)])
        if nan is not None:
            pixels[nan] = 0  # transparent
        masked = self.masked
        if masked is not None and masked.shape == image.shape:
            pixels[masked[::y_step, ::x_step]] = MASKED_ARGB
        if self.nonfinite is not None:
            self.nonfinite.paint(pixels, y_step, x_step)
        rows, cols = pixels.shape
        self._pixels = pixels
        self.qimage = QImage(
            pixels.data, cols, rows, 4 * cols, QImage.Format.Format_ARGB32_Premultiplied
        )
        self._renderRequired = False
        self._unrenderable = False

    def _argb_table(self, lut: np.ndarray) -> np.ndarray:
        """pyqtgraph's (N, 3 or 4) uint8 lookup table as N premultiplied ARGB words."""
        if self._lut32[0] is not lut:
            rgb = lut[:, :3].astype(np.uint32)
            alpha = lut[:, 3].astype(np.uint32) if lut.shape[1] > 3 else np.full(len(lut), 255)
            rgb = rgb * alpha[:, None] // 255  # premultiplied
            table = (alpha << 24) | (rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]
            self._lut32 = (lut, table.astype(np.uint32))
        return self._lut32[1]


class ColourBar(pg.ColorBarItem):
    """pyqtgraph's ``ColorBarItem`` with a value axis that keeps its pictures.

    The colour range changes on most steps but returns to the same round numbers
    (``nice_ceiling``), so its axis is a ``CachedAxisItem``.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        old = self.axis
        axis = CachedAxisItem("right")
        self.setAxisItems({"right": axis})
        old.setParentItem(None)  # out of the layout; without this it would still be drawn
        # what ColorBarItem.__init__ did to the axis it made
        axis.setWidth(45)
        axis.setStyle(showValues=True)
        axis.unlinkFromView()
        axis.setRange(*self.values)
        self.axis = axis


class HeatmapView(QWidget):
    """One matrix as a heatmap, with axes in index units, tick labels and a colour bar.

    >>> view = HeatmapView()                                            # doctest: +SKIP
    >>> view.set_matrix(attn[0, 3], row_labels=tokens, col_labels=tokens,
    ...                 scale="probability")                            # doctest: +SKIP
    """

    hovered = Signal(int, int, float)
    """(row, col, value) under the mouse, in full-resolution indices."""

    #: colour scale per view (``scale_key``), kept for the session: a new view of the same
    #: kind (the attention map of another trace) starts with the choice the last one had
    remembered_scales: ClassVar[dict[str, str]] = {}

    def __init__(
        self,
        parent: QWidget | None = None,
        *,
        max_display: int = MAX_DISPLAY,
        scale_key: str = "",
    ):
        super().__init__(parent)
        self._max_display = max_display
        self.scale_key = scale_key
        self._colour_scale = self.remembered_scales.get(scale_key, "linear")
        self._last_call: tuple | None = None  # set_matrix's arguments, to redraw on a change
        self.scale_note = ""
        self._full: np.ndarray | None = None  # full-resolution matrix, for hover values
        self._row_labels: Sequence[str] | None = None
        self._col_labels: Sequence[str] | None = None
        self._row_name = "row"
        self._col_name = "col"
        self._shape: tuple[int, int] | None = None
        self._cmap_name = ""
        # on a dark theme zero is drawn dark too, so near-zero tensors do not glare
        dark = self.palette().color(QPalette.ColorRole.Base).lightness() < 128
        self._signed_cmap = SIGNED_CMAP_DARK if dark else SIGNED_CMAP
        self._square = False
        self._extra = (0.0, 0.0)  # margins added for square cells (across, down), pixels
        self._hover_pos: QPointF | None = None  # where the mouse last was, scene coordinates
        self._axis_names: tuple[str, str] = ("", "")
        self._ticks_shown: dict[str, tuple] = {}  # axis -> (labels, first, last, every)
        self._widest: tuple = (None, 0)  # (labels, pixel width of the widest)

        self._build_plot()
        self._build_message_page()
        self._build_legend()
        self._build_hover_line()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(self._pages, 1)
        layout.addWidget(self._legend)
        bottom = QHBoxLayout()
        bottom.setContentsMargins(0, 0, 0, 0)
        bottom.addWidget(self._hover, 1)
        self.scale_combo = QComboBox(self)
        self.scale_combo.setObjectName("heatmapColourScale")
        for mode, text in COLOUR_SCALES.items():
            self.scale_combo.addItem(f"colour: {text}", mode)
        self.scale_combo.setCurrentIndex(list(COLOUR_SCALES).index(self._colour_scale))
        self.scale_combo.setToolTip("How values map to colours (remembered for this view)")
        self.scale_combo.currentIndexChanged.connect(
            lambda i: self.set_colour_scale(self.scale_combo.itemData(i))
        )
        bottom.addWidget(self.scale_combo)
        layout.addLayout(bottom)

    def _build_plot(self) -> None:
        """One image with left and top axes and a colour bar on the right, in the palette's
        colours; hover and zoom refresh the hover line and the tick labels."""
        palette = self.palette()
        background = palette.color(QPalette.ColorRole.Base)
        foreground = palette.color(QPalette.ColorRole.Text)
        self._canvas = pg.GraphicsLayoutWidget()
        self._canvas.setBackground(background)
        self._canvas.setMinimumSize(160, 120)
        self._canvas.ci.setContentsMargins(*PLOT_MARGINS)
        self._plot: pg.PlotItem = self._canvas.addPlot(
            axisItems={"left": CachedAxisItem("left"), "top": TokenAxisItem("top")}
        )
        self._plot.hideButtons()
        self._plot.setMenuEnabled(False)
        self._plot.showAxis("top")
        self._plot.hideAxis("bottom")
        self._plot.getViewBox().setDefaultPadding(0.0)
        self._plot.invertY(True)  # row 0 on top, like a printed matrix
        self._plot.getViewBox().setBorder(pg.mkPen(palette.color(QPalette.ColorRole.Mid)))
        for name in ("left", "top"):
            axis = self._plot.getAxis(name)
            axis.setPen(pg.mkPen(foreground))
            axis.setTextPen(pg.mkPen(foreground))
            # ticks point outward: an axis that reached into the plot would be repainted
            # with the image on every step
            axis.setStyle(tickLength=4, tickTextOffset=2, autoExpandTextSpace=True)
            axis.setStyle(tickFont=self.font())  # the font labels are measured in
        self._image = ColouredImageItem(axisOrder="row-major")
        self._image_rect = QRectF()
        self._plot.addItem(self._image)
        self._colorbar = ColourBar(
            values=(0.0, 1.0),
            colorMap=colormap(SEQUENTIAL_CMAP),
            width=12,
            interactive=False,
        )
        self._colorbar.setImageItem(self._image, insert_in=self._plot)
        bar_axis = self._colorbar.axis
        bar_axis.setPen(pg.mkPen(foreground))
        bar_axis.setTextPen(pg.mkPen(foreground))
        self._canvas.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self._canvas.installEventFilter(self)  # a mouse that leaves takes the readout along
        self._plot.getViewBox().sigRangeChanged.connect(self._update_ticks)
        self._plot.getViewBox().sigResized.connect(self._fit_square)
        self._plot.getViewBox().sigResized.connect(self._update_ticks)

    def _build_message_page(self) -> None:
        """The page shown instead of the plot (no values captured, a scalar, an empty step)."""
        self._message = QLabel()
        self._message.setObjectName("heatmapMessage")
        self._message.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._message.setWordWrap(True)
        self._message.setTextFormat(Qt.TextFormat.RichText)
        self._message.setMargin(24)
        self._message.setAutoFillBackground(True)
        self._message.setBackgroundRole(QPalette.ColorRole.Base)

        self._pages = QStackedLayout()
        self._pages.addWidget(self._canvas)
        self._pages.addWidget(self._message)

    def _build_legend(self) -> None:
        """The legend line for mask fills (hidden when there are none)."""
        self._legend = QLabel()
        self._legend.setObjectName("heatmapMaskedLegend")
        self._legend.setTextFormat(Qt.TextFormat.RichText)
        self._legend.hide()
        self._masked: np.ndarray | None = None
        self._nonfinite = None  # NonFiniteCells of the shown matrix (nonfinite_cells)

    def _build_hover_line(self) -> None:
        """``(row, col) = value`` under the mouse, in a small muted line under the plot."""
        self._hover = ElidedLabel()
        self._hover.setObjectName("heatmapHover")
        font = self._hover.font()
        font.setPointSizeF(max(7.0, font.pointSizeF() - 1))
        self._hover.setFont(font)
        self._hover.setForegroundRole(QPalette.ColorRole.PlaceholderText)

    # ---- parts, for callers and tests

    @property
    def image_item(self) -> pg.ImageItem:
        return self._image

    @property
    def plot_item(self) -> pg.PlotItem:
        return self._plot

    @property
    def colorbar(self) -> pg.ColorBarItem:
        return self._colorbar

    @property
    def row_axis(self) -> pg.AxisItem:
        return self._plot.getAxis("left")

    @property
    def col_axis(self) -> pg.AxisItem:
        return self._plot.getAxis("top")

    @property
    def colormap_name(self) -> str:
        return self._cmap_name

    @property
    def signed_colormap(self) -> str:
        """The diverging map used for signed data (light or dark centre, by theme)."""
        return self._signed_cmap

    @property
    def message(self) -> str:
        """The text shown instead of the plot, or "" while the plot is shown."""
        return self._message.text() if self._pages.currentIndex() == 1 else ""

    @property
    def matrix(self) -> np.ndarray | None:
        """The full-resolution matrix on show (None while a message is shown)."""
        return self._full if self._pages.currentIndex() == 0 else None

    @property
    def stride(self) -> tuple[int, int]:
        """Display downsampling (rows, cols): 1 means every index has its own pixel."""
        if self._full is None:
            return (1, 1)
        r, c = self._full.shape
        return display_stride(r, self._max_display), display_stride(c, self._max_display)

    # ---- showing data

    @property
    def colour_scale(self) -> str:
        return self._colour_scale

    def set_colour_scale(self, mode: str) -> None:
        """``linear``, ``log``, ``row`` or ``percentile`` (:func:`apply_colour_scale`);
        remembered for this view's ``scale_key`` and applied to the matrix on show."""
        if mode not in COLOUR_SCALES:
            raise ValueError(f"unknown colour scale {mode!r}; one of {', '.join(COLOUR_SCALES)}")
        self._colour_scale = mode
        if self.scale_key:
            self.remembered_scales[self.scale_key] = mode
        index = list(COLOUR_SCALES).index(mode)
        if self.scale_combo.currentIndex() != index:
            self.scale_combo.setCurrentIndex(index)  # comes back here once, then stops
            return
        if self._last_call is not None:
            args, kwargs = self._last_call
            self.set_matrix(*args, **kwargs)

    def set_matrix(
        self,
        matrix: torch.Tensor | np.ndarray,
        *,
        row_labels: Sequence[str] | None = None,
        col_labels: Sequence[str] | None = None,
        row_name: str = "row",
        col_name: str = "col",
        scale: Scale = "auto",
        levels: tuple[float, float] | None = None,
        square: bool = False,
        masked: np.ndarray | None = None,
    ) -> None:
        """Show a 2-D matrix. Rows run down, columns across; row 0 is the top row.

        ``row_labels``/``col_labels`` (one string per index) become tick labels;
        ``row_name``/``col_name`` name the axes (``"query"``, ``"C"``...). ``levels``
        overrides the automatic colour range; ``square`` draws every cell square (for
        attention maps, where rows and columns are the same tokens).

        Mask fills (``-1e9``, ``±inf``: see ``masked_cells``) are drawn in their own colour,
        with a legend line, and the colour scale comes from the other cells; ``masked``
        adds cells to treat so (the compare view passes the fills of A and of B).
        """
        self._last_call = (
            (matrix,),
            dict(row_labels=row_labels, col_labels=col_labels, row_name=row_name,
                 col_name=col_name, scale=scale, levels=levels, square=square, masked=masked),
        )  # fmt: skip
        full = _as_numpy(matrix)
        if full.ndim != 2:
            raise ValueError(f"HeatmapView shows 2-D matrices, got shape {tuple(full.shape)}")
        rows, cols = full.shape
        if rows == 0 or cols == 0:
            self.show_message(f"Empty matrix of shape ({rows}, {cols}).")
            return
        self._full = full

        # ---- pixels: stride big matrices down to about MAX_DISPLAY per axis
        sr, sc = display_stride(rows, self._max_display), display_stride(cols, self._max_display)
        shown = full[::sr, ::sc] if (sr > 1 or sc > 1) else full
        self._nonfinite = nonfinite_cells(shown)  # their own colours, over everything
        self._image.nonfinite = self._nonfinite
        self._set_masked(shown, None if masked is None else masked[::sr, ::sc])
        if self._masked is not None:  # off the scale: NaN for the levels, their colour on top
            shown = np.where(self._masked, np.nan, shown)
        if not np.isfinite(shown).all():  # Inf breaks level scaling: draw it like NaN (blank)
            shown = np.where(np.isfinite(shown), shown, np.nan)

        cmap_name, auto_levels = choose_levels(shown, scale)
        if cmap_name == SIGNED_CMAP:
            cmap_name = self._signed_cmap
        levels = levels or auto_levels
        signed = cmap_name == self._signed_cmap
        shown, levels, self.scale_note = apply_colour_scale(
            shown, self._colour_scale, levels, signed
        )
        self.scale_combo.setToolTip(
            "How values map to colours (remembered for this view)"
            + (f"\nnow: {self.scale_note}" if self.scale_note else "")
        )
        self._image.setImage(shown, autoLevels=False, levels=levels)
        rect = QRectF(0, 0, shown.shape[1] * sc, shown.shape[0] * sr)
        if rect != self._image_rect:  # a new transform would re-lay out the view
            self._image_rect = rect
            self._image.setRect(rect)
        if cmap_name != self._cmap_name:
            self._colorbar.setColorMap(colormap(cmap_name))
            self._cmap_name = cmap_name
        if tuple(self._colorbar.levels()) != tuple(levels):  # same levels: no axis repaint
            self._colorbar.setLevels(levels)

        # ---- axes: names, token ticks, and the view range when the shape changed
        self._row_labels, self._col_labels = row_labels, col_labels
        self._row_name, self._col_name = row_name, col_name
        if (row_name, col_name) != self._axis_names:  # setLabel re-lays out the axis
            self._axis_names = (row_name, col_name)
            self._plot.setLabel("left", row_name)
            self._plot.setLabel("top", col_name)
        vb = self._plot.getViewBox()
        if square != self._square:
            self._square = square
            self._shape = None
        if self._shape != (rows, cols):
            self._shape = (rows, cols)
            vb.setLimits(xMin=0, xMax=cols, yMin=0, yMax=rows)  # the view stays on the map
            vb.setRange(xRange=(0, cols), yRange=(0, rows), padding=0.0)
        self._fit_square()
        self._update_ticks()
        self._pages.setCurrentIndex(0)
        if self._hover_pos is not None:  # the readout follows the step: the new value there
            self._on_mouse_moved(self._hover_pos)

    def _fit_square(self, *_args) -> None:
        """Square cells (``set_matrix(square=True)``) with the view still on the map.

        Locking the view's aspect would widen its range past the map on one axis (a
        13-wide map shown from -10 to 25 in a wide dock). Instead the plot keeps the map's
        range and gets margins on that side, so its view box has the map's own aspect
        and the cells come out square; without ``square`` the margins go back."""
        vb = self._plot.getViewBox()
        extra = (0.0, 0.0)
        if self._square and self._shape is not None:
            rows, cols = self._shape
            width, height = vb.width() + self._extra[0], vb.height() + self._extra[1]
            if width <= 0 or height <= 0:
                return
            if width * rows > height * cols:  # too wide for the map: narrow it
                extra = (width - height * cols / rows, 0.0)
            else:
                extra = (0.0, height - width * rows / cols)
        if abs(extra[0] - self._extra[0]) < 1 and abs(extra[1] - self._extra[1]) < 1:
            return
        self._extra = extra
        left, top, right, bottom = PLOT_MARGINS
        x, y = extra[0] / 2, extra[1] / 2
        self._canvas.ci.setContentsMargins(left + x, top + y, right + x, bottom + y)

    def _set_masked(self, shown: np.ndarray, extra: np.ndarray | None) -> None:
        cells = masked_cells(shown)
        if cells is not None and self._nonfinite is not None:  # ±Inf: named as such
            cells = cells.finite_only(shown)
        where = None if cells is None else cells.where
        if extra is not None and extra.shape == shown.shape and extra.any():
            where = extra if where is None else (where | extra)
        self._masked = where
        self._image.masked = where
        parts = [] if self._nonfinite is None else [self._nonfinite.legend_html()]
        if where is not None:
            text = cells.legend() if cells is not None else f"masked ({int(where.sum())} cells)"
            if cells is not None and where is not cells.where:
                text = f"masked ({int(where.sum())} cells in A or B)"
            parts.insert(0, f"<span style='color:{MASKED_COLOUR}'>■</span> {text}")
        if not parts:
            self._legend.hide()
            return
        self._legend.setText(" &nbsp; ".join(parts))
        self._legend.show()

    @property
    def masked_legend(self) -> str:
        """The legend line of the mask fills ("" when the matrix has none)."""
        return self._legend.text() if self._legend.isVisibleTo(self) else ""

    def is_masked(self, row: int, col: int) -> bool:
        """Whether the cell is drawn as a mask fill (full-resolution indices)."""
        if self._masked is None or self._full is None:
            return False
        sr = display_stride(self._full.shape[0], self._max_display)
        sc = display_stride(self._full.shape[1], self._max_display)
        r, c = row // sr, col // sc
        return bool(self._masked[r, c]) if r < self._masked.shape[0] else False

    def show_message(self, text: str) -> None:
        """Replace the plot with a short explanation (rich text allowed)."""
        self._full = None
        self._legend.hide()
        self._message.setText(text)
        self._pages.setCurrentIndex(1)
        self._hover.setText(" ")

    def _update_ticks(self, *_args) -> None:
        """Hand each axis the token labels that fit the visible range (or numeric ticks).

        Down the rows a label needs one text line. Across the columns it needs the widest
        label's width; where that is more than a column, the labels turn upright
        (:class:`TokenAxisItem`) and need only a line each, so every token that has a
        line's width of column is labelled, and every 2nd, 4th ... only below that."""
        vb = self._plot.getViewBox()
        (x0, x1), (y0, y1) = vb.viewRange()
        line_height = self.fontMetrics().height() + 2
        for axis, labels, lo, hi, pixels in (
            ("left", self._row_labels, y0, y1, vb.height()),
            ("top", self._col_labels, x0, x1, vb.width()),
        ):
            upright = False
            if not labels:
                key: tuple = (None,)
            else:
                label_pixels = line_height
                if axis == "top":  # across: the widest label plus a gap, else upright
                    across = self._label_width(labels) + 8
                    upright = token_every(hi - lo, pixels, across) > 1
                    label_pixels = line_height if upright else across
                every = token_every(hi - lo, pixels, label_pixels)
                key = (labels, math.floor(lo), math.ceil(hi), upright, every)
            if axis == "top":
                self.col_axis.set_upright(upright, self._label_width(labels) if labels else 0)
            if self._ticks_shown.get(axis) == key:
                continue  # same ticks as last time: the axis keeps its cached picture
            self._ticks_shown[axis] = key
            ticks = token_ticks(labels, lo, hi, key[-1]) if labels else None
            self._plot.getAxis(axis).setTicks(ticks)

    def _label_width(self, labels: Sequence[str]) -> int:
        if self._widest[0] is not labels:
            metrics = self.fontMetrics()
            self._widest = (labels, max(metrics.horizontalAdvance(s) for s in labels))
        return self._widest[1]

    # ---- hover

    def value_at(self, row: int, col: int) -> float:
        """The full-resolution value at (row, col)."""
        if self._full is None:
            raise ValueError("no matrix is shown")
        return float(self._full[row, col])

    def hover_text(self, row: int, col: int) -> str:
        """``query 3 'l' · key 1 'e' = 0.1234`` for the cell at (row, col)."""

        def part(name: str, index: int, labels: Sequence[str] | None) -> str:
            label = f" '{labels[index]}'" if labels is not None and index < len(labels) else ""
            return f"{name} {index}{label}"

        value = self.value_at(row, col)
        masked = " (masked)" if self.is_masked(row, col) else ""
        return (
            f"{part(self._row_name, row, self._row_labels)} · "
            f"{part(self._col_name, col, self._col_labels)} = {value:.6g}{masked}"
        )

    def cell_at_scene_pos(self, pos: QPointF) -> tuple[int, int] | None:
        """(row, col) under a scene position, or None outside the matrix."""
        if self._full is None:
            return None
        vb = self._plot.getViewBox()
        if not vb.sceneBoundingRect().contains(pos):
            return None
        p = vb.mapSceneToView(pos)
        row, col = math.floor(p.y()), math.floor(p.x())
        rows, cols = self._full.shape
        if 0 <= row < rows and 0 <= col < cols:
            return row, col
        return None

    def eventFilter(self, watched, event) -> bool:
        if watched is self._canvas and event.type() == QEvent.Type.Leave:
            self._hover_pos = None
            self._hover.setText(" ")
        return super().eventFilter(watched, event)

    def _on_mouse_moved(self, pos: QPointF) -> None:
        self._hover_pos = QPointF(pos)
        cell = self.cell_at_scene_pos(pos)
        if cell is None:
            self._hover.setText(" ")
            self._canvas.setToolTip("")
            return
        row, col = cell
        text = self.hover_text(row, col)
        self._hover.setText(text)
        self._canvas.setToolTip(text)
        if self._canvas.underMouse():
            QToolTip.showText(self._canvas.cursor().pos(), text, self._canvas)
        self.hovered.emit(row, col, self.value_at(row, col))

    # ---- export

    def export(self, path: str | Path) -> Path:
        """Write the plot (image, axes, colour bar) as PNG or SVG, chosen by the suffix."""
        # deferred: pyqtgraph's exporters load only on export, not at start-up
        from pyqtgraph import exporters

        path = Path(path)
        suffix = path.suffix.lower()
        if self._full is None:
            raise ValueError("nothing to export: no heatmap is shown")
        if suffix == ".svg":
            try:
                exporters.SVGExporter(self._plot).export(str(path))
            except ValueError:
                # pyqtgraph 0.14's SVG exporter cannot parse the closed paths ("... Z") that
                # Qt >= 6.9 writes (pyqtgraph issue #3495); Qt's own generator can.
                self._export_svg_with_qt(path)
        elif suffix in (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff"):
            exporter = exporters.ImageExporter(self._plot)
            width = max(800, int(self._plot.sceneBoundingRect().width()))
            exporter.parameters()["width"] = width
            exporter.export(str(path))
        else:
            raise ValueError(
                f"cannot export a heatmap as {suffix or 'a file without suffix'}: use .png or .svg"
            )
        return path

    def _export_svg_with_qt(self, path: Path) -> None:
        # deferred: QtSvg loads only when someone exports an SVG, not at start-up
        from PySide6.QtSvg import QSvgGenerator

        source = self._plot.sceneBoundingRect()
        generator = QSvgGenerator()
        generator.setFileName(str(path))
        generator.setSize(QSize(int(source.width()), int(source.height())))
        generator.setViewBox(QRectF(0, 0, source.width(), source.height()))
        generator.setTitle("Scratchformer heatmap")
        painter = QPainter(generator)
        try:
            self._canvas.scene().render(
                painter, QRectF(0, 0, source.width(), source.height()), source
            )
        finally:
            painter.end()
