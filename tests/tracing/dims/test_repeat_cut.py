"""The inputs pass stops where a layer stack only repeats layers it has run (issue 31, cost).

A 12-layer model's pass at other sizes need not run layers 2 to 11 again: each is layer 1
once more, so its steps' shapes in the pass are layer 1's. ``repeat_cut`` says where the pass
may stop, ``fill_repeats`` gives the later layers the shapes of the run layer they repeat.
The reference is the same trace with the whole pass run: every name and every proof must be
the same.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from helpers.models.nanogpt import GPT

import tracing
import tracing.dims.passes as passes
import tracing.dims.prove as prove
from scratchformer import DecoderOnlyTransformer, ModelConfig


def _traced(model, ids, cut: bool, monkeypatch):
    passes._CACHE.clear()
    prove._MEMO.clear()
    with monkeypatch.context() as m:
        if not cut:
            m.setattr(passes, "repeat_cut", lambda model: None)
        return tracing.trace(model, ids, capture="shapes")


def _llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=5,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    return transformers.AutoModelForCausalLM.from_config(config)


def _gemma2():
    """Sliding-window and full-attention layers in turn: two kinds of layer."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Gemma2Config(
        vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=6,
        num_attention_heads=6, num_key_value_heads=2, head_dim=8, sliding_window=16,
        max_position_embeddings=128,
    )  # fmt: skip
    return transformers.AutoModelForCausalLM.from_config(config)


MODELS = {
    "ours": lambda: DecoderOnlyTransformer(ModelConfig.preset("demo", n_layers=5)),
    "nanogpt": lambda: GPT(vocab_size=96, block_size=64, n_layer=5),
    "llama": _llama,
    "gemma2": _gemma2,
}


@pytest.mark.parametrize("name", list(MODELS))
def test_names_and_proofs_are_those_of_the_whole_pass(name, monkeypatch):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    ids = torch.randint(0, 96, (1, 40))  # more than 20 tokens: the short pass for real
    cut = _traced(model, ids, True, monkeypatch)
    whole = _traced(model, ids, False, monkeypatch)
    stopped = cut.meta["dims_evidence"].get("stopped_at")
    assert stopped is not None and stopped.rsplit(".", 1)[1].isdigit()
    assert "stopped_at" not in whole.meta["dims_evidence"]
    assert [r.dims for r in cut.tensors] == [r.dims for r in whole.tensors]
    assert [r.why for r in cut.tensors] == [r.why for r in whole.tensors]
    assert cut.meta["dims"] == whole.meta["dims"]


class Layer(nn.Module):
    def __init__(self, width, layer_idx, sliding):
        super().__init__()
        self.layer_idx, self.sliding = layer_idx, sliding  # a counter, and a kind
        self.fc = nn.Linear(width, width)


def test_the_cut_follows_every_kind_of_layer_and_a_repeat_of_the_last():
    same = nn.ModuleList(Layer(8, i, False) for i in range(6))
    assert passes.repeat_cut(nn.ModuleDict({"layers": same})) == ("layers", 2)
    turns = nn.ModuleList(Layer(8, i, i % 2 == 1) for i in range(6))
    assert passes.repeat_cut(nn.ModuleDict({"layers": turns})) == ("layers", 3)
    widths = nn.ModuleList(Layer(8 + i, 0, False) for i in range(6))  # all differ
    assert passes.repeat_cut(nn.ModuleDict({"layers": widths})) is None
    short = nn.ModuleList(Layer(8, i, False) for i in range(2))
    assert passes.repeat_cut(nn.ModuleDict({"layers": short})) is None


def test_fill_repeats_gives_a_later_layer_the_shapes_of_the_run_layer_it_repeats():
    """Hand-built: layers 0 and 1 ran in the pass (T 11 -> 7); layer 2 repeats layer 1 step
    for step and takes its pass shapes; layer 3, one step wider, repeats none: ``None``."""
    from tracing.dims.align import fill_repeats
    from tracing.record import SourceLocation, Step, TensorRecord

    tensors, steps, shapes = [], [], []

    def tensor(shape, other):
        tensors.append(TensorRecord(len(tensors), shape, "float32"))
        shapes.append(other)
        return len(tensors) - 1

    x = tensor((2, 11, 8), (3, 7, 8))
    for layer, width, ran in ((0, 8, True), (1, 8, True), (2, 8, False), (3, 9, False)):
        out = tensor((2, 11, width), (3, 7, width) if ran else None)
        where = SourceLocation("model.py", 10, "h = self.fc(h)")
        steps.append(Step(len(steps), "op", f"layers.{layer}.fc", "linear", where, (x,), (out,)))
        x = out
    filled = fill_repeats(steps, tensors, list(shapes), ("layers", 2))
    assert filled[3] == (3, 7, 8)  # layer 2: layer 1's shape in the pass
    assert filled[4] is None  # layer 3: its width differs, so no run layer is its model
    assert filled[:3] == shapes[:3]
