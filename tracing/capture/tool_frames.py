"""Folders of the tool that runs a trace (the app, its commands), never the user's code.

A step's source is the user's line that made the call. When the nearest caller outside
``torch`` and ``tracing`` is the tool itself (``session.py`` calling ``tracing.trace``), the
step has no user line: its source is ``None`` rather than the tool's own call. The app
registers its folder here when it is imported; this module imports nothing heavy.
"""

from __future__ import annotations

import os

DIRS: list[str] = []


def hide(directory: str) -> None:
    """Treat code under ``directory`` as the tool's: a frame walk stops there, empty."""
    path = os.path.abspath(directory).rstrip(os.sep) + os.sep
    if path not in DIRS:
        DIRS.append(path)
