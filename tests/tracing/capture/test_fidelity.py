"""Tracing changes nothing, and sees what an independent tool (torchinfo) sees.

For each model: the traced output is bit-identical to the untraced one; the module steps
come in the same order, with the same output shapes, as ``torchinfo.summary`` reports;
and parameter counts agree with torchinfo and with ``model.parameters()``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torchinfo
from helpers.tiny_models import tensors_in, tiny_gpt2
from torch import nn

import tracing
from tracing.capture.tracer import Tracer

# --------------------------------------------------------------------------- models


def our_model():
    from scratchformer import DecoderOnlyTransformer, ModelConfig

    config = ModelConfig.preset("nano") if _has_preset("nano") else ModelConfig.preset("demo")
    model = DecoderOnlyTransformer(config)
    return model, (torch.randint(0, config.vocab_size, (2, 11)),), {}


def _has_preset(name: str) -> bool:
    from scratchformer import ModelConfig

    try:
        ModelConfig.preset(name)
    except Exception:
        return False
    return True


def torch_decoder():
    layer = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
    model = nn.TransformerDecoder(layer, num_layers=2, norm=nn.LayerNorm(32))
    tgt, memory = torch.randn(2, 9, 32), torch.randn(2, 5, 32)
    mask = nn.Transformer.generate_square_subsequent_mask(9)
    return model, (tgt, memory), {"tgt_mask": mask, "tgt_is_causal": True}


def hf_gpt2():
    model = tiny_gpt2(seed=None, train=True, n_embd=48, vocab_size=101)
    return model, (torch.randint(0, 101, (2, 9)),), {}


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3),
            nn.ReLU(),
        )
        self.head = nn.Linear(16 * 6 * 6, 10)

    def forward(self, x):
        x = self.features(x)
        return self.head(torch.flatten(x, 1))


def conv_net():
    model = ConvNet()
    model.train()
    with torch.no_grad():  # give BatchNorm non-trivial running stats
        model(torch.randn(4, 3, 16, 16))
    return model, (torch.randn(2, 3, 16, 16),), {}


class DictTuple(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(6, 8)
        self.heads = nn.ModuleDict({"a": nn.Linear(8, 3), "b": nn.Linear(8, 2)})

    def forward(self, x):
        h = torch.tanh(self.encoder(x))
        return {"a": self.heads["a"](h), "both": (self.heads["b"](h), h.mean(-1))}


def dict_tuple():
    return DictTuple(), (torch.randn(4, 6),), {}


class InPlaceNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 5)
        self.act = nn.ReLU(inplace=True)
        self.drop = nn.Dropout(0.5, inplace=True)

    def forward(self, x):
        y = self.lin(x)
        y.mul_(2).add_(1)
        y = self.act(y)
        y = self.drop(y)
        y += x
        y.masked_fill_(y > 3, 3.0)
        return y


def in_place():
    return InPlaceNet(), (torch.randn(3, 5),), {}


class KeywordOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.gate = nn.Linear(4, 4)

    def forward(self, x, *, gate_input, scale=1.0):
        return self.proj(x) * torch.sigmoid(self.gate(gate_input)) * scale


def keyword_only():
    return KeywordOnly(), (torch.randn(2, 3, 4),), {"gate_input": torch.randn(2, 3, 4)}


MODELS: dict[str, Callable] = {
    "scratchformer": our_model,
    "torch-decoder": torch_decoder,
    "hf-gpt2": hf_gpt2,
    "conv": conv_net,
    "dict-tuple": dict_tuple,
    "in-place": in_place,
    "keyword-only": keyword_only,
}


# --------------------------------------------------------------------------- helpers


def _clone_inputs(args, kwargs):
    clone = lambda v: v.clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
    return tuple(clone(a) for a in args), {k: clone(v) for k, v in kwargs.items()}


def _torchinfo_output(step) -> int:
    """The output torchinfo sizes: the first tensor, or for a dict the first tensor under
    its last key (``torchinfo.layer_info.calculate_size``)."""
    names = step.output_names
    if names[0].startswith("output["):
        key = names[-1].split("]")[0]  # "output['both'"
        for tensor_id, name in zip(step.outputs, names):
            if name.startswith(key) and "'" in key:
                return tensor_id
    return step.outputs[0]


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("capture", ["shapes", "values"])
def test_traced_output_is_bit_identical(name, capture):
    model, args, kwargs = MODELS[name]()
    model.eval()
    a, k = _clone_inputs(args, kwargs)
    with torch.no_grad():
        expected = model(*a, **k)
    a, k = _clone_inputs(args, kwargs)
    with torch.no_grad(), Tracer(model, capture=capture) as tracer:
        got = model(*a, **k)
    got, expected = tensors_in(got), tensors_in(expected)
    assert got and len(got) == len(expected)
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
    assert len(tracer.trace.steps) > len(tracer.trace.module_steps(""))


@pytest.mark.parametrize("name", list(MODELS))
def test_module_shapes_and_params_match_torchinfo(name):
    model, args, kwargs = MODELS[name]()
    model.eval()
    summary = torchinfo.summary(
        model, input_data=list(args), verbose=0, depth=100, mode="eval", **kwargs
    )
    trace = tracing.trace(model, *args, capture="shapes", **kwargs)

    paths = {id(m): p for p, m in model.named_modules()}
    theirs = [
        (paths[id(layer.module)], layer.output_size)
        for layer in summary.summary_list
        if layer.executed
    ]
    ours = [s for s in trace.steps if s.kind == "module"]
    assert [p for p, _ in theirs] == [s.module for s in ours]
    compared = 0
    for (path, size), step in zip(theirs, ours):
        if size and step.outputs:  # torchinfo reports [] for outputs it cannot size
            assert list(trace.tensor(_torchinfo_output(step)).shape) == list(size), path
            compared += 1
    assert compared >= len(ours) // 2

    root = summary.summary_list[0]
    assert trace.modules[""].params_total == root.num_params
    assert trace.modules[""].params_total == sum(p.numel() for p in model.parameters())
    for layer in summary.summary_list:
        info = trace.modules[paths[id(layer.module)]]
        if not layer.is_recursive:
            assert info.params_total == layer.num_params, info.path


def test_torch_decoder_multihead_attention_is_recorded():
    """nn.MultiheadAttention's fused fast path must not hide it from the trace."""
    model, args, kwargs = torch_decoder()
    trace = tracing.trace(model, *args, capture="shapes", **kwargs)
    attn = trace.module_steps("layers.0.self_attn")[0]
    ops = [s.op for s in trace.children_of(attn.index)]
    assert "multi_head_attention_forward" in ops or "softmax" in ops
    assert trace.tensor(attn.outputs[0]).shape == (2, 9, 32)


def test_in_place_model_values_follow_each_version():
    model, args, _ = in_place()
    model.eval()
    x = args[0]
    trace = tracing.trace(model, x, capture="values")
    ops = [s for s in trace.steps if s.kind == "op"]
    names = [s.op for s in ops]
    assert names[:3] == ["linear", "mul_", "add_"]
    with torch.no_grad():
        y = model.lin(x)
    assert torch.equal(trace.value(ops[0].outputs[0]), y)
    assert torch.equal(trace.value(ops[1].outputs[0]), y * 2)
    assert torch.equal(trace.value(ops[2].outputs[0]), y * 2 + 1)
    assert names == ["linear", "mul_", "add_", "relu", "dropout", "add_", "gt", "masked_fill_"]
    # every in-place change is its own record; eval-mode dropout changes nothing
    ids = [s.outputs[0] for s in ops]
    assert ids[4] == ids[3]
    del ids[4]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("capture", ["shapes", "stats", "values"])
def test_a_second_trace_of_a_model_records_the_same(name, capture):
    """What is cached per model between traces (structure, forward wrappers, dims) must
    not change the record: two traces of the same call are equal, step by step."""
    model, args, kwargs = MODELS[name]()
    model.eval()
    traces = []
    with torch.no_grad():
        for _ in range(2):  # one line, so the root step's source line is the same
            a, k = _clone_inputs(args, kwargs)
            traces.append(tracing.trace(model, *a, capture=capture, **k))
    first, second = traces
    assert len(second.steps) == len(first.steps)
    for a, b in zip(first.steps, second.steps):
        assert a == b, f"step {a.index}: {a} != {b}"
    assert second.tensors == first.tensors
    assert set(second.values) == set(first.values)
    assert all(torch.equal(first.values[k], second.values[k]) for k in first.values)
