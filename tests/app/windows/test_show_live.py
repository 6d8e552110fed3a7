"""``tracing.show(model, x)`` in the caller's process: the window holds the live model
(edits enabled), and returns when it closes; where no viewer can run, the saved copy's
edit actions say why, naming the user's own model, never a bundled one."""

from __future__ import annotations

import pytest
import torch

import tracing

pytestmark = pytest.mark.gui


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16)

    def forward(self, x):
        return self.head(self.emb(x))


def test_show_opens_in_process_on_the_live_model(qapp, monkeypatch):
    import app.windows.live_show
    from app.core import edit_session
    from app.windows.main_window import MainWindow
    from tracing import show_app

    viewer = (app.windows.live_show.show_live, app.windows.live_show.can_run_here)
    monkeypatch.setattr(show_app, "_VIEWERS", [viewer])  # registered for this test only
    monkeypatch.setenv("SCRATCHFORMER_QUIT_AFTER_MS", "2500")
    seen = {}
    original = MainWindow.close

    def close(self):
        seen["request"] = self.trace_request
        seen["problem"] = edit_session.missing_model(self.trace_request, self.trace)
        return original(self)

    monkeypatch.setattr(MainWindow, "close", close)
    model = Tiny()
    x = torch.tensor([[1, 2, 3]])
    shown = tracing.show(model, x)
    assert shown is not None and shown.steps
    assert seen["problem"] is None  # edits can run: the window has the live model
    assert seen["request"].source.kind == "live" and seen["request"].source.live.model is model
    assert app.windows.live_show.can_run_here() is None


def test_a_saved_copy_says_how_to_edit_the_users_model():
    from app.core import edit_session

    trace = tracing.trace(Tiny(), torch.tensor([[1, 2]]), meta={"shown_by": "tracing.show"})
    problem = edit_session.missing_model(None, trace)
    assert "%gui qt" in problem and "tracing.show(model, x)" in problem
    assert "demo" not in problem and "preset" not in problem
