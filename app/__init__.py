"""The Scratchformer desktop debugger (PySide6 + pyqtgraph) and its command line."""

import sys

if sys.version_info < (3, 12) and sys.implementation.name == "cpython":
    # PySide6 6.12 on Python 3.11 drops one reference to None on every call of a void C++
    # method (QPainter.setPen, drawLine ...). None starts with ~50k references, so a few
    # hundred repaints of a plot later Python aborts with "none_dealloc: deallocating
    # None". Python 3.12+ makes None immortal (PEP 683); here we give it a reference count
    # no program can use up, which is what immortality amounts to.
    import ctypes

    ctypes.c_ssize_t.from_address(id(None)).value += 1 << 60
