"""Opening a big trace without the garbage collector walking it again and again.

A 50,000-step trace is about half a million small Python objects the collector tracks
(records, tuples, the panes' indexes), living as long as the window shows the trace. The
cyclic collector examines new objects when they are young, again when they are promoted,
and the whole heap again each time it has grown by a quarter: while a trace was read and
the panes built, that was 0.4-0.6 s of a 2 s open, and a full pass later could land in
the middle of a step.

:func:`long_lived` pauses the collector while the trace is opened and shown (reference
counting still frees everything as usual) and then *freezes* what exists
(``gc.freeze``): later collections skip it. When it replaces an earlier trace, frozen
the same way, one full collection runs first, so whatever the replaced trace left in
reference cycles is freed rather than frozen again (one pass, instead of the several a
growing heap costs).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from tracing.collector import paused


@contextlib.contextmanager
def long_lived() -> Iterator[None]:
    """Build long-lived objects (a trace and its panes) inside this block."""
    replacing = gc.get_freeze_count() > 0
    gc.unfreeze()  # the previous trace's objects: collectable again once replaced
    try:
        with paused():
            yield
    finally:
        if replacing:
            gc.collect()  # what the replaced trace left in cycles, before freezing again
        gc.freeze()
