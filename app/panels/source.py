"""The source pane: the file a step ran in, with line numbers and that line highlighted.

Documents are cached per file, so moving between steps swaps a document and moves a
highlight instead of re-reading text (this runs on every step). When the file cannot be
read (a trace from another machine) the pane shows the recorded line text alone.

A trace carries the text of its source files (``Trace.sources``): the pane shows that
embedded copy, the code that actually ran, and says so in a note when the file on disk
differs (edited since) or is not there. The line that raised (``Trace.failure``) is
marked in red, also when it is no op's line (a ``NameError``).

A trace names its source files by path, and a trace opened from disk may come from
anyone, so files on disk are read only through ``tracing.source_files`` (a regular
``.py`` file of bounded size, nothing else: no devices, FIFOs or ``/etc/passwd``), and
for a trace opened from a file (:meth:`SourceView.set_ask_before_reading`) a file it does
not carry is shown only once the user has pressed "Show file from disk" for it: until
then the pane shows the recorded line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QColor, QFontDatabase, QPainter, QTextCursor, QTextDocument, QTextFormat
from PySide6.QtWidgets import (
    QLabel,
    QPlainTextDocumentLayout,
    QPlainTextEdit,
    QTextEdit,
    QToolButton,
    QWidget,
)

from app import theme
from app.widgets.common import make_scroll_area_opaque
from tracing.file.source_files import SourceRefused, read_source_file

if TYPE_CHECKING:  # pragma: no cover
    from tracing import SourceLocation


class _Gutter(QWidget):
    def __init__(self, editor: SourceView):
        super().__init__(editor)
        self.editor = editor

    def sizeHint(self) -> QSize:
        return QSize(self.editor.gutter_width(), 0)

    def paintEvent(self, event) -> None:
        self.editor.paint_gutter(event)


class SourceView(QPlainTextEdit):
    """Read-only source with a line-number gutter; :meth:`show_location` follows the step."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("sourceView")
        self.setReadOnly(True)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._documents: dict[str, QTextDocument] = {}
        self._embedded: dict[str, str] = {}  # file -> text carried by the trace
        self._disk_state: dict[str, str] = {}  # file -> "same", "differs", "missing"
        self.failed_line = False  # the highlighted line is where the forward raised
        self.note = QLabel(self)
        self.note.setObjectName("sourceNote")
        self.note.setStyleSheet(
            f"QLabel {{ background: {theme.TOOLTIP}; color: {theme.CURRENT};"
            " padding: 2px 6px; border-radius: 3px; }"
        )
        self.note.hide()
        self._refused: dict[str, str] = {}  # file -> why it is not read from disk
        self.ask_before_reading = False
        self._confirmed: set[str] = set()
        self._pending: SourceLocation | None = None  # waiting for "Show file from disk"
        self.show_file_button = QToolButton(self)
        self.show_file_button.setText("Show file from disk")
        self.show_file_button.setToolTip(
            "This trace was opened from a file and names this source file; read it from "
            "this computer's disk"
        )
        self.show_file_button.setStyleSheet(
            f"QToolButton {{ background: {theme.TOOLTIP}; color: {theme.CURRENT};"
            " padding: 3px 8px; border-radius: 3px; }"
        )
        self.show_file_button.clicked.connect(self.confirm_pending)
        self.show_file_button.hide()
        self._placeholder = self._make_document("")
        self.setDocument(self._placeholder)
        self.current_file: str | None = None
        self.current_line: int | None = None
        self._gutter = _Gutter(self)
        self._gutter.setAttribute(Qt.WidgetAttribute.WA_OpaquePaintEvent)
        # scrolling to the line happens on every step: keep those repaints inside this pane
        make_scroll_area_opaque(self, QColor(theme.SOURCE_BACKGROUND))
        self.blockCountChanged.connect(self._update_gutter_width)
        self.updateRequest.connect(self._update_gutter)
        self._update_gutter_width()

    # ---- content

    def _make_document(self, text: str) -> QTextDocument:
        doc = QTextDocument(self)
        doc.setDocumentLayout(QPlainTextDocumentLayout(doc))
        doc.setDefaultFont(self.font())
        doc.setPlainText(text)
        return doc

    def set_sources(self, sources: dict[str, str]) -> None:
        """The source text a trace carries (``Trace.sources``); shown instead of the disk."""
        self._embedded = dict(sources or {})
        self._documents.clear()
        self._disk_state.clear()
        self.current_file = self.current_line = None

    def disk_state(self, file: str) -> str:
        """For an embedded file: ``"same"``, ``"differs"`` (edited since the trace) or
        ``"missing"`` on this disk; ``""`` for a file the trace does not carry."""
        if file not in self._embedded:
            return ""
        state = self._disk_state.get(file)
        if state is None:
            try:
                disk = read_source_file(file)
            except SourceRefused:
                state = "missing"
            else:
                state = "same" if disk == self._embedded[file] else "differs"
            self._disk_state[file] = state
        return state

    def set_ask_before_reading(self, ask: bool) -> None:
        """``True`` for a trace opened from a file: read a source file it names (and does
        not carry) only after the user confirms it, one press per file. Forgets what was
        read before."""
        self.ask_before_reading = ask
        self._confirmed.clear()
        self._documents.clear()
        self._refused.clear()
        self._pending = None
        self.show_file_button.hide()

    def confirm_pending(self) -> None:
        """The user pressed "Show file from disk": read the pending file and show it."""
        source = self._pending
        if source is None:
            return
        self._confirmed.add(source.file)
        self._pending = None
        self.show_file_button.hide()
        self.current_file = self.current_line = None
        self.show_location(source, self.failed_line)

    def _set_pending(self, source: SourceLocation | None) -> None:
        self._pending = source
        if source is None or source.file in self._refused:
            self.show_file_button.hide()
            return
        self._place_button()
        self.show_file_button.show()
        self.show_file_button.raise_()

    def _place_button(self) -> None:
        hint = self.show_file_button.sizeHint()
        area = self.viewport().geometry()  # bottom right: the recorded line stays readable
        self.show_file_button.setGeometry(
            area.right() - hint.width() - 8,
            area.bottom() - hint.height() - 6,
            hint.width(),
            hint.height(),
        )

    def _update_note(self, file: str | None) -> None:
        state = self.disk_state(file) if file else ""
        text = {
            "differs": "the file on disk differs from this trace's copy (edited since?)",
            "missing": "this trace's copy of the file (not on this disk)",
        }.get(state, "")
        self.note.setText(text)
        self.note.setVisible(bool(text))
        if text:
            self.note.adjustSize()
            area = self.viewport().geometry()
            self.note.move(area.right() - self.note.width() - 8, area.top() + 4)
            self.note.raise_()

    def _document_for(self, file: str) -> QTextDocument | None:
        doc = self._documents.get(file)
        if doc is None and file not in self._refused:
            text = self._embedded.get(file)
            if text is None:
                try:
                    text = read_source_file(file)
                except SourceRefused as e:
                    self._refused[file] = str(e)
                    return None
            doc = self._make_document(text)
            self._documents[file] = doc
        return doc

    def show_location(self, source: SourceLocation | None, failed: bool = False) -> None:
        """Show the file around ``source.line`` with the line highlighted (in red when
        ``failed``: the line that raised)."""
        if failed != self.failed_line:
            self.failed_line = failed
            self.current_line = None  # same line, other colour: highlight again
        self._update_note(source.file if source is not None else None)
        if source is None:
            self._set_pending(None)
            self._show_text("# no source line recorded for this step", None)
            return
        file = source.file
        asking = self.ask_before_reading and file not in self._embedded
        if asking and file and file not in self._confirmed and file not in self._refused:
            self._set_pending(source)
            where = f"# {file}:{source.line} (not read until you ask)\n"
            self._show_text(where + (source.text or ""), 2 if source.text else None)
            return
        self._set_pending(None)
        doc = self._document_for(file) if file else None
        if doc is None or source.line < 1 or source.line > doc.blockCount():
            why = self._refused.get(file) or "file not available here"
            where = f"# {file}:{source.line} ({why})\n"
            self._show_text(where + (source.text or ""), 2 if source.text else None)
            return
        if self.document() is not doc:
            self.setDocument(doc)
            self._update_gutter_width()
        elif self.current_file == source.file and self.current_line == source.line:
            return  # already on show
        self.current_file = source.file
        self._highlight(source.line)

    def _show_text(self, text: str, line: int | None) -> None:
        self._placeholder.setPlainText(text)
        if self.document() is not self._placeholder:
            self.setDocument(self._placeholder)
        self.current_file = None
        self._highlight(line)

    def _highlight(self, line: int | None) -> None:
        self.current_line = line
        if line is None:
            self.setExtraSelections([])
            return
        block = self.document().findBlockByNumber(line - 1)
        cursor = QTextCursor(block)
        selection = QTextEdit.ExtraSelection()
        fill = theme.FAILED_LINE if self.failed_line else theme.CURRENT_LINE
        selection.format.setBackground(QColor(fill))
        selection.format.setProperty(QTextFormat.Property.FullWidthSelection, True)
        selection.cursor = cursor
        self.setExtraSelections([selection])
        visible = self._line_visible(block)
        self.setTextCursor(cursor)
        if not visible:
            # centred, the next lines the steps visit are already in view: a view that
            # scrolled on every step would repaint all of itself on every step
            self.centerCursor()
        self._gutter.update()

    def _line_visible(self, block) -> bool:
        """Whether ``block`` lies wholly inside the viewport (one line of margin)."""
        if not block.isValid() or not block.isVisible():
            return False
        top = self.blockBoundingGeometry(block).translated(self.contentOffset()).top()
        height = self.blockBoundingRect(block).height()
        return height <= top and top + 2 * height <= self.viewport().height()

    def highlighted_text(self) -> str:
        """The text of the highlighted line ("" when none)."""
        if self.current_line is None:
            return ""
        return self.document().findBlockByNumber(self.current_line - 1).text()

    # ---- gutter (line numbers)

    def gutter_width(self) -> int:
        digits = max(3, len(str(self.document().blockCount())))
        return 14 + self.fontMetrics().horizontalAdvance("9") * digits

    def _update_gutter_width(self, *_args) -> None:
        self.setViewportMargins(self.gutter_width(), 0, 0, 0)

    def _update_gutter(self, rect: QRect, dy: int) -> None:
        if dy:
            self._gutter.scroll(0, dy)
        else:
            self._gutter.update(0, rect.y(), self._gutter.width(), rect.height())

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        cr = self.contentsRect()
        self._gutter.setGeometry(QRect(cr.left(), cr.top(), self.gutter_width(), cr.height()))
        self._place_button()

    def paint_gutter(self, event) -> None:
        painter = QPainter(self._gutter)
        painter.fillRect(event.rect(), QColor(theme.BACKGROUND))
        block = self.firstVisibleBlock()
        number = block.blockNumber()
        top = round(self.blockBoundingGeometry(block).translated(self.contentOffset()).top())
        bottom = top + round(self.blockBoundingRect(block).height())
        height = self.fontMetrics().height()
        width = self._gutter.width() - 6
        while block.isValid() and top <= event.rect().bottom():
            if block.isVisible() and bottom >= event.rect().top():
                current = (
                    self.current_line == number + 1 and self.document() is not self._placeholder
                )
                painter.setPen(QColor(theme.CURRENT if current else theme.TEXT_DISABLED))
                painter.drawText(
                    0, top, width, height, Qt.AlignmentFlag.AlignRight, str(number + 1)
                )
            block = block.next()
            top = bottom
            bottom = top + round(self.blockBoundingRect(block).height())
            number += 1
        painter.end()
