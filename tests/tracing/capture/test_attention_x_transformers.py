"""x-transformers' attention, recognised by what it does: its softmax runs in an ``Attend``
module between two einsums (``b h i j``), which no name marks as attention.

Skipped where x-transformers is not installed (the suite does not need it; install it for
these and the benchmarks with ``pip install --no-deps x-transformers einops einx loguru
frozendict torch-einops-utils``, so that it pulls no other torch). References: the maps the
model returns itself (``return_attn=True``), and weight surgery on ``to_out``.
"""

from __future__ import annotations

import copy

import pytest
import torch

import tracing
from tracing.capture.edits import Edit, Zero
from tracing.runs.patching import sweep

x_transformers = pytest.importorskip("x_transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

H, D, KV = 6, 8, 2


def _model(**attn):
    torch.manual_seed(0)
    layers = x_transformers.Decoder(dim=48, depth=2, heads=H, attn_dim_head=D, **attn)
    return x_transformers.TransformerWrapper(
        num_tokens=50, max_seq_len=32, attn_layers=layers
    ).eval()


@pytest.mark.parametrize("attn", [{}, {"attn_kv_heads": KV}], ids=["mha", "gqa"])
def test_maps_equal_the_models_own_and_a_head_edit_equals_surgery(attn):
    model = _model(**attn)
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        plain, own = model(ids, return_attn=True)
    t = tracing.trace(model, ids, capture="shapes")
    maps = t.attention_maps()
    layers = ["attn_layers.layers.0.1", "attn_layers.layers.2.1"]  # attention, feed-forward...
    assert list(maps) == [f"{p}.attend" for p in layers]
    for got, want in zip(maps.values(), own, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

    path, head = layers[1], 4
    edited = tracing.trace(model, ids, capture="values", edits=[Edit(path, Zero(), head=head)])
    surgery = copy.deepcopy(model)
    with torch.no_grad():
        surgery.get_submodule(path).to_out.weight[:, head * D : (head + 1) * D] = 0
        want = surgery(ids)
    assert (want - plain).abs().max() > 1e-3
    torch.testing.assert_close(edited.value(edited.steps[0].outputs[0]), want, rtol=0, atol=2e-6)
    assert edited.meta["edits"][0]["site"] == f"{path}.attend"


def test_fused_flash_attention_gives_the_same_maps_and_a_head_sweep_runs():
    einsum, fused = _model(), _model(attn_flash=True)
    ids = torch.randint(0, 50, (1, 7))
    a = tracing.trace(einsum, ids, capture="shapes").attention_maps()
    b = tracing.trace(fused, ids, capture="shapes").attention_maps()
    assert len(a) == len(b) == 2
    for x, y in zip(a.values(), b.values()):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    corrupted = ids.clone()
    corrupted[0, 3] = (corrupted[0, 3] + 1) % 50
    result = sweep(einsum, ids, corrupted, over="heads")
    assert result.values.shape == (2, H) and torch.isfinite(result.values).all()
