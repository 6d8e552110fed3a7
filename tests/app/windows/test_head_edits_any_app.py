"""Zero from the attention grid's head menu on every kind of attention (the tutorial's
classes, nanoGPT's fused sdpa, Hugging Face Llama sdpa with GQA, HF GPT-2 eager): the edit
lands on that head's output, the Edits panel says where (and which key/value head a GQA
query head reads), and the edited run equals the model with that head's slice of the
output projection zeroed."""

from __future__ import annotations

import pytest
import torch
from helpers.app_fixtures import window_on_live_model
from helpers.head_models import KINDS, ids, surgery

from app.core import edit_session
from tracing.runs.patching import output_logits
from tracing.sites import site_steps

pytestmark = pytest.mark.gui
pytest.importorskip("transformers")


@pytest.fixture(params=["tutorial", "nanogpt-sdpa", "llama-sdpa-gqa", "gpt2-eager", "xglm-folded"])
def window(qtbot, tmp_path, request):
    kind = KINDS[request.param]
    model = kind.build()
    x = ids(kind.vocab, shape=(1, 6))
    w = window_on_live_model(qtbot, tmp_path, model, (x,))
    return w, kind, model, x


def test_head_menu_zeroes_the_head_on_every_kind(window, errors):
    w, kind, model, x = window
    attention = w.inspector.attention
    layer_path = kind.attention.format(1)
    layer = next(i for i, p in enumerate(attention.paths) if p.startswith(layer_path))
    map_step = attention.step_for_layer(layer)
    head = kind.heads - 1
    menu = w.edits.head_menu(map_step, head)
    assert menu.actions()[0].text() == f"Edit head {head} of {w.trace.steps[map_step].module}"
    assert {a.objectName() for a in menu.actions() if a.isEnabled()} >= {"edit_zero"}

    def make(action):
        return edit_session.edit_for_head(w.trace, map_step, head, action)

    assert w.edits.apply("zero", make, background=False)
    assert not errors
    (edit,) = w.edits.edits
    assert str(edit.site).replace("@0", "") == (kind.resolved or kind.attention).format(1)
    listed = w.edits.panel.list.item(0).text()
    assert f"at {layer_path} head {head}" in listed
    if kind.kv_heads:
        assert f"it shares key/value head {head // (kind.heads // kind.kv_heads)} of 2" in listed
    edited = w.edits.last_compare.trace_b
    assert edited.meta["edits"][0]["steps"]
    logits = output_logits(edited.value(site_steps(edited, "")[0].outputs[0]))
    with torch.no_grad():
        expected = output_logits(surgery(kind, model, 1, head)(x))
    torch.testing.assert_close(logits, expected, rtol=0, atol=2e-6)
