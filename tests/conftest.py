"""Shared test set-up.

Qt must run headless: the platform is chosen when the first QApplication is built, so the
variable is set here, before pytest-qt or any test can create one.
"""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    """Every test starts from the same random state."""
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and a shared CI box is not thrashed).
    A test module asks for it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
