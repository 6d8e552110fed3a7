"""The edited prediction card says how much changed (issue 25): the logit and probability
change of the top tokens with the digits a small change needs, the KL divergence of the
two output distributions, and "no change" only when the outputs are bit-identical."""

from __future__ import annotations

import pytest
import torch
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QLabel

from app.core import edit_session, session
from app.panels.edits import percent, signed
from app.windows.main_window import MainWindow

pytestmark = pytest.mark.gui

PROMPT = "wordplay|yalp"


@pytest.fixture
def window(qtbot, tmp_path, errors):
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    w = MainWindow(settings=settings)
    qtbot.addWidget(w)
    request = session.TraceRequest(PROMPT, session.ModelSource("demo"))
    w._pending_request = request
    w._on_trace_finished(session.run_trace(request))
    return w


def test_small_changes_keep_their_digits():
    assert percent(0.00734) == "0.734%" and percent(2.5e-9) == "2.5e-07%"
    assert signed(0.0) == "0" and signed(0.037) == "+0.0370" and signed(-2.4e-6) == "-2.4e-06"
    assert signed(0.000123, " pp", 100) == "+0.0123 pp"
    row = edit_session.PredictionRow(75, "K", 0.00734, 0.00735)
    assert "+0.001 pp" in edit_session.prediction_summary([row])  # not a rounded "+0.0%"


def test_the_card_shows_logits_and_kl_of_an_edit(window, errors):
    controller = window.edits
    head_step = window.inspector.attention.step_for_layer(1)
    make = lambda a: edit_session.edit_for_head(window.trace, head_step, 2, a)  # noqa: E731
    assert controller.apply("zero", make, background=False), errors
    compare = controller.last_compare
    before = edit_session.final_logits(window.trace)[0, -1].double()
    after = edit_session.final_logits(compare.trace_b)[0, -1].double()
    change = edit_session.output_change(window.trace, compare.trace_b)
    expected_kl = torch.nn.functional.kl_div(
        after.log_softmax(-1), before.log_softmax(-1), log_target=True, reduction="sum"
    )
    assert not change.identical and change.kl == pytest.approx(float(expected_kl), rel=1e-9)
    assert change.max_logit_change == pytest.approx(float((after - before).abs().max()))
    rows = edit_session.prediction_change(window.trace, compare.trace_b)
    d = next(r for r in rows if r.token == ord("d"))
    assert d.logit_change == pytest.approx(float(after[ord("d")] - before[ord("d")]))
    card = compare.findChild(QLabel, "predictionChange")
    text = card.text()
    assert "KL(before ‖ after) = " in text and f"{change.kl:.3g} nats" in text
    assert "Δlogit" in text and signed(d.logit_change) in text
    assert "no change" not in text


def test_no_change_only_when_bit_identical(window):
    compare = window.edits.show_comparison(window.trace, window.trace)
    change = edit_session.output_change(window.trace, window.trace)
    assert change.identical and change.kl == 0.0
    text = compare.findChild(QLabel, "predictionChange").text()
    assert "no change: the edited run's outputs are bit-identical" in text
    compare.close()
