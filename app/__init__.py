"""The Scratchformer desktop debugger (PySide6 + pyqtgraph) and its command line.

Steps are never attributed to this package's code: in a trace the app or the CLI runs,
the root step's source is the user's line or none (``tracing.tool_frames``).
"""

import os as _os

from tracing.capture import tool_frames as _tool_frames

_tool_frames.hide(_os.path.dirname(_os.path.abspath(__file__)))
