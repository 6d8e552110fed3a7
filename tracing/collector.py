"""The cyclic garbage collector paused while a trace's many small objects are built.

Opening a trace or computing its report makes hundreds of thousands of small containers
(records, tuples, report rows) and keeps every one of them, in no reference cycle. The
cyclic collector would examine them when young, again when promoted, and walk the whole
heap again each time it has grown by a quarter: for nothing, and for most of the time a
60,000-step report took (``benchmarks/bench_report_memory.py``). Reference counting still
frees everything as usual while it is paused.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Run the block with the cyclic collector off (as it was after: on if it was on)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
