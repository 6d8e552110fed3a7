"""Shared test set-up.

Qt must run headless: the platform is chosen when the first QApplication is built, so the
variable is set here, before pytest-qt or any test can create one.

Markers are given here, not remembered in each module: a test that asks (directly or
through its fixtures) for ``qtbot``, ``qapp`` or ``qtmodeltester`` needs a QApplication and
is marked ``gui``, so ``-m "not gui"`` runs without Qt; that run then fails if a
QApplication was started anyway. Traced demos are shared per session (``demo_values``...).
"""

from __future__ import annotations

import gc
import os
import sys

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("PYQTGRAPH_QT_LIB", "PySide6")
os.environ.setdefault("SCRATCHFORMER_DIMS_STRICT", "1")  # a fault in naming fails the test
# One torch thread in every worker, and in every Python a test starts (they inherit it):
# xdist already runs one worker per core, and torch's two OpenMP threads in each of them
# oversubscribe the cores: a thread that waits for one descheduled spins, which cost the
# suite a third of its CPU (a head sweep: 41 s of CPU against 10 s, busy machine). A test
# about threads sets them itself (``test_container_reads.threads``).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest

# torch, the model and the helpers are imported where a fixture needs them, not here: the
# xdist controller loads this file too and runs no test (it would import torch for nothing)
if "torch" in sys.modules:  # imported before this file: OMP_NUM_THREADS came too late
    sys.modules["torch"].set_num_threads(1)

QT_FIXTURES = {"qtbot", "qapp", "qtmodeltester"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that needs a QApplication ``gui``."""
    for item in items:
        if QT_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.gui)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under ``-m "not gui"`` no QApplication may exist: a test that starts one is a gui
    test the hook above did not recognise."""
    if "not gui" not in (session.config.getoption("markexpr") or ""):
        return
    widgets = sys.modules.get("PySide6.QtWidgets")
    if widgets is not None and widgets.QApplication.instance() is not None:
        session.config.get_terminal_writer().line(
            'A QApplication was started under -m "not gui": mark that test gui.', red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _seed() -> None:
    """Every test starts from the same random state."""
    import torch

    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _nothing_frozen():
    """Every test starts, as a fresh app does, with no objects frozen: a window that opened
    a trace froze the whole heap (``app.core.long_lived``), and the next test's first open
    would take that for a trace it replaces and collect the worker's heap in full
    (torch, transformers, Qt: 0.4 s a window)."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread (and a shared CI box is not thrashed).
    A test module asks for it with ``pytestmark = pytest.mark.usefixtures("one_thread")``;
    the suite now starts on one thread (above), so this only restores a module's test that
    changed it."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# --------------------------------------------------------------------------- shared traces


@pytest.fixture(scope="session")
def demo_model():
    """The trained demo model, built once (read-only: a test that edits weights builds its own)."""
    import scratchformer

    return scratchformer.demo_model()


@pytest.fixture(scope="session")
def demo_shapes(demo_model):
    """The demo traced on its prompt at ``capture="shapes"``, once per run."""
    from helpers.tiny_models import trace_demo

    return trace_demo(demo_model, capture="shapes")


@pytest.fixture(scope="session")
def demo_stats(demo_model):
    """The demo traced on its prompt at ``capture="stats"``, once per run."""
    from helpers.tiny_models import trace_demo

    return trace_demo(demo_model, capture="stats")


@pytest.fixture(scope="session")
def demo_values(demo_model):
    """The demo traced on its prompt at ``capture="values"``, once per run."""
    from helpers.tiny_models import trace_demo

    return trace_demo(demo_model, capture="values")


@pytest.fixture
def errors(monkeypatch) -> list[tuple[str, str]]:
    """Every error dialog the app would show, as (title, text); info dialogs are skipped."""
    from app.windows import dialogs  # here, not at the top: conftest itself loads no Qt

    shown: list[tuple[str, str]] = []
    monkeypatch.setattr(
        dialogs, "show_error", lambda parent, t, x, details="": shown.append((t, x))
    )
    monkeypatch.setattr(dialogs, "show_info", lambda parent, t, x: None)
    return shown
