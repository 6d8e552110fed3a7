"""The source pane: the file a step ran in, with line numbers and that line highlighted.

Documents are cached per file, so moving between steps swaps a document and moves a
highlight instead of re-reading text (this runs on every step). When the file cannot be
read (a trace from another machine) the pane shows the recorded line text alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtGui import QColor, QFontDatabase, QPainter, QTextCursor, QTextDocument, QTextFormat
from PySide6.QtWidgets import QPlainTextDocumentLayout, QPlainTextEdit, QTextEdit, QWidget

from app import theme
from app.widgets.common import make_scroll_area_opaque

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

    def _document_for(self, file: str) -> QTextDocument | None:
        doc = self._documents.get(file)
        if doc is None:
            try:
                text = Path(file).read_text(encoding="utf-8", errors="replace")
            except (OSError, ValueError):
                return None
            doc = self._make_document(text)
            self._documents[file] = doc
        return doc

    def show_location(self, source: SourceLocation | None) -> None:
        """Show the file around ``source.line`` with the line highlighted."""
        if source is None:
            self._show_text("# no source line recorded for this step", None)
            return
        doc = self._document_for(source.file) if source.file else None
        if doc is None or source.line < 1 or source.line > doc.blockCount():
            where = f"# {source.file}:{source.line} (file not available here)\n"
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
        selection.format.setBackground(QColor(theme.CURRENT_LINE))
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
