"""The Scratchformer desktop debugger (PySide6 + pyqtgraph) and its command line."""
