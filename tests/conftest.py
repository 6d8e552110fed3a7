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
