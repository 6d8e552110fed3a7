"""Zero and Mean-ablate on a head of torch's own attention (nn.TransformerDecoder) from the
attention grid's menu: the edit lands on that module's per-head output, and the edited run
equals one with that head's columns of out_proj.weight zeroed."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.app_fixtures import window_on_live_model
from torch import nn

from app.core import edit_session
from tracing.sites import site_steps

pytestmark = pytest.mark.gui


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.dec = nn.TransformerDecoder(layer, 2)
        self.head = nn.Linear(8, 20)

    def forward(self, ids):
        h = self.emb(ids)
        return self.head(self.dec(h, h))


@pytest.fixture
def window(qtbot, tmp_path):
    torch.manual_seed(0)
    model = Decoder().eval()
    ids = torch.tensor([[1, 5, 7, 2, 9]])
    w = window_on_live_model(qtbot, tmp_path, model, (ids,))
    return w, model, ids


@pytest.mark.parametrize("kind", ["zero", "mean"])
def test_head_menu_edits_an_mha_head(window, errors, kind):
    w, model, ids = window
    attention = w.inspector.attention
    paths = attention.paths
    assert any("multihead_attn" in p for p in paths) and any("self_attn" in p for p in paths)
    layer = next(i for i, p in enumerate(paths) if p.startswith("dec.layers.1.multihead_attn"))
    map_step = attention.step_for_layer(layer)
    menu = w.edits.head_menu(map_step, 1)
    enabled = {a.objectName(): a.isEnabled() for a in menu.actions() if a.objectName()}
    assert enabled["edit_zero"] and enabled["edit_mean"]

    def make(action):
        return edit_session.edit_for_head(w.trace, map_step, 1, action)

    assert w.edits.apply(kind, make, background=False)
    assert not errors
    (edit,) = w.edits.edits
    assert str(edit.site) == "dec.layers.1.multihead_attn@0" and edit.head == 1
    edited = w.edits.last_compare.trace_b
    assert edited.meta["edits"][0]["steps"]
    logits = edited.value(site_steps(edited, "")[0].outputs[0])
    if kind == "zero":  # against weight surgery
        other = copy.deepcopy(model)
        with torch.no_grad():
            other.dec.layers[1].multihead_attn.out_proj.weight[:, 4:8] = 0
            expected = other(ids)
        torch.testing.assert_close(logits, expected, rtol=0, atol=1e-6)
    else:
        assert not torch.equal(logits, w.trace.value(site_steps(w.trace, "")[0].outputs[0]))
