"""A folder an expensive fixture fills once per suite run, whichever xdist worker asks.

With ``--dist worksteal`` a module's tests can land on both workers, and a module-scoped
fixture then runs in each of them: a spawn of ranks or every documented block, twice. The
first worker to ask fills the folder (under a lock, in the temporary folder the run's
workers share: pytest-xdist's recipe for a session fixture run once); the others wait for
it and read what it left. A fill that raises leaves no mark, so the next worker that asks
tries again (and fails its own tests the same way). Only for results the tests read.
"""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def shared_folder(
    tmp_path_factory: pytest.TempPathFactory, name: str, fill: Callable[[Path], None]
) -> Path:
    """``tmp/<name>`` filled by ``fill(folder)`` once in this run, shared by its workers."""
    base = tmp_path_factory.getbasetemp()
    if base.name.startswith("popen-gw"):  # an xdist worker: pytest-N/popen-gwK
        base = base.parent
    folder = base / name
    done = base / f"{name}.done"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also on raising
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a fill that raised left
            folder.mkdir()
            fill(folder)
            done.touch()
    return folder
