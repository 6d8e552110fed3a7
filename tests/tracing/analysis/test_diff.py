"""Comparing two traces: alignment, per-step metrics, first divergence, rendering, CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tracing
from app.cli import main
from scratchformer import DecoderOnlyTransformer, ModelConfig
from tracing.analysis.trace_diff import diff, step_keys, tensor_metrics

# --------------------------------------------------------------------------- fixtures


def _demo_model(seed: int = 0) -> DecoderOnlyTransformer:
    torch.manual_seed(seed)
    cfg = ModelConfig.preset("demo", n_layers=3, block_size=16)
    return DecoderOnlyTransformer(cfg).eval()


@pytest.fixture(scope="module")
def model_pair():
    """The demo model and a copy with one weight of blocks.1's first FF layer changed."""
    a = _demo_model()
    b = _demo_model()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        b.blocks[1].feed_forward.linear1.weight[3, 5] += 0.25
    return a, b


@pytest.fixture(scope="module")
def tokens():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (1, 9), generator=g)


@pytest.fixture(scope="module")
def value_traces(model_pair, tokens):
    """Traces (capture="values") of both models on the same tokens, made once."""
    a, b = model_pair
    return tracing.trace(a, tokens, capture="values"), tracing.trace(b, tokens, capture="values")


# --------------------------------------------------------------------------- metrics


def test_tensor_metrics_match_independent_formulas():
    a = torch.randn(4, 7)
    b = a + 0.1 * torch.randn(4, 7)
    max_abs, rel_l2, cosine = tensor_metrics(a, b)
    assert max_abs == pytest.approx(float((a - b).abs().max()), rel=1e-6)
    assert rel_l2 == pytest.approx(float(torch.linalg.norm(a - b) / torch.linalg.norm(a)), 1e-6)
    ref_cos = float(F.cosine_similarity(a.flatten(), b.flatten(), dim=0))
    assert cosine == pytest.approx(ref_cos, rel=1e-6)


def test_tensor_metrics_nonfinite_and_zero():
    a = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    assert tensor_metrics(a, a.clone()) == (0.0, 0.0, pytest.approx(1.0))
    b = a.clone()
    b[1] = 0.0  # NaN on one side only
    max_abs, rel_l2, _ = tensor_metrics(a, b)
    assert math.isinf(max_abs) and math.isinf(rel_l2)
    z = torch.zeros(3)
    assert tensor_metrics(z, z) == (0.0, 0.0, 1.0)
    assert tensor_metrics(z, torch.ones(3))[1:] == (math.inf, 0.0)
    ints = torch.arange(5)
    assert tensor_metrics(ints, ints + 1)[0] == 1.0


# --------------------------------------------------------------------------- real traces


def test_trace_against_itself_is_all_zero(model_pair, tokens, value_traces):
    a, _ = model_pair
    t = value_traces[0]
    d = diff(t, t)
    assert len(d) == len(t.steps)
    assert d.identical and d.first_divergence() is None
    compared = [o for e in d for o in e.outputs if o.compared]
    assert len(compared) >= len(t.steps) - 5  # nearly every step kept its value
    assert all(o.max_abs == 0 and o.rel_l2 == 0 for o in compared)
    assert all(o.cosine == pytest.approx(1.0) for o in compared if o.dtype_a == "float32")
    assert set(d.module_scores().values()) == {0.0}
    # a second, independent run of the same model and input is also identical
    assert diff(t, tracing.trace(a, tokens, capture="values")).identical


def test_first_divergence_is_the_op_that_uses_the_changed_weight(value_traces):
    ta, tb = value_traces
    d = diff(ta, tb)
    first = d.first_divergence()
    assert first is not None
    assert first.module == "blocks.1.feed_forward.linear1"
    assert (first.kind, first.op) == ("op", "linear")
    step = ta.steps[first.a_index]
    assert "blocks.1.feed_forward.linear1.weight" in step.input_names  # it used that weight
    assert first.max_abs > 0 and first.cosine < 1
    # everything that ran before it is bit-identical, and the damage spreads after it
    for e in d:
        if e.order < first.order:
            assert e.status == "equal", e.label
    assert d.for_step_a(ta.steps[-1].index).status == "changed"  # the LM head op
    assert d.counts()["only_a"] == d.counts()["only_b"] == 0
    delta = d.difference(first)  # A - B, for the app's difference heatmap
    ref = ta.value(ta.steps[first.a_index].outputs[0]) - tb.value(
        tb.steps[first.b_index].outputs[0]
    )
    torch.testing.assert_close(delta, ref)
    assert float(delta.abs().max()) == pytest.approx(first.max_abs)
    scores = d.module_scores()
    assert scores["blocks.0"] == 0 and scores["blocks.1.self_attn"] == 0
    assert scores["blocks.1.feed_forward.linear1"] > 0 and scores["blocks.2"] > 0


def test_stats_only_traces_still_find_the_divergence(model_pair, tokens):
    a, b = model_pair
    d = diff(tracing.trace(a, tokens, capture="stats"), tracing.trace(b, tokens, capture="stats"))
    first = d.first_divergence()
    assert first is not None and first.module == "blocks.1.feed_forward.linear1"
    assert first.outputs[0].stats_delta > 0
    assert first.outputs[0].max_abs is None  # no values to compare


def test_different_prompt_lengths_align_with_shape_changes(model_pair):
    a, _ = model_pair
    ta = tracing.trace(a, torch.randint(0, 256, (1, 5)), capture="stats")
    tb = tracing.trace(a, torch.randint(0, 256, (1, 8)), capture="stats")
    d = diff(ta, tb)
    c = d.counts()
    assert c["only_a"] == c["only_b"] == 0 and c["shape"] > 0
    shape_entries = [e for e in d if e.status == "shape"]
    assert any(o.shape_a == (1, 5, 64) and o.shape_b == (1, 8, 64) for e in shape_entries
               for o in e.outputs)  # fmt: skip
    assert math.isinf(d.module_scores()["blocks.0"])
    assert d.difference(shape_entries[0]) is None  # shapes differ: no A - B


class _TwoLayer(nn.Module):
    def __init__(self, extra: bool = False):
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.extra = nn.Linear(4, 4) if extra else None
        self.last = nn.Linear(4, 2)

    def forward(self, x):
        x = self.act(self.first(x))
        if self.extra is not None:
            x = x + self.extra(x)  # a second version of the model adds a layer
        return self.last(x)


def test_steps_on_one_side_only_are_reported_not_dropped():
    torch.manual_seed(0)
    small = _TwoLayer()
    big = _TwoLayer(extra=True)
    big.load_state_dict(small.state_dict(), strict=False)
    with torch.no_grad():
        big.extra.weight.zero_()
        big.extra.bias.zero_()  # the extra layer adds exactly zero
    x = torch.randn(3, 4)
    ta = tracing.trace(small, x, capture="values")
    tb = tracing.trace(big, x, capture="values")
    d = diff(ta, tb)
    only_b = [e for e in d if e.status == "only_b"]
    assert {e.module for e in only_b} >= {"extra"}
    assert {(e.module, e.op) for e in only_b} >= {("", "add")}  # the residual +
    assert not [e for e in d if e.status == "only_a"]
    # every step of each trace appears exactly once
    assert sorted(e.a_index for e in d if e.a_index is not None) == list(range(len(ta)))
    assert sorted(e.b_index for e in d if e.b_index is not None) == list(range(len(tb)))
    # the layers both have line up and, the extra one adding zero, agree
    last = next(e for e in d if e.module == "last" and e.kind == "module")
    assert last.status == "equal"
    assert d.first_divergence().status == "only_b"
    assert math.isinf(d.module_scores()["extra"])


def test_shared_module_calls_align_by_call_number():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(torch.relu(self.lin(x)))

    m = Shared()
    t = tracing.trace(m, torch.randn(2, 3), capture="shapes")
    keys = step_keys(t)
    lin_keys = [k for k in keys if k[1] == "lin"]
    assert ("module", "lin", "Linear", 0, 0) in lin_keys
    assert ("module", "lin", "Linear", 1, 0) in lin_keys
    assert ("op", "lin", "linear", 1, 0) in lin_keys  # the op of the second call
    assert len(set(keys)) == len(keys)


def test_saved_trace_round_trip_diffs_to_zero(value_traces, tmp_path):
    t = value_traces[0]
    t.save(tmp_path / "a.trace")
    assert diff(t, tracing.load(tmp_path / "a.trace")).identical


# --------------------------------------------------------------------------- rendering


def test_render_json_and_markdown(value_traces):
    d = diff(*value_traces)
    data = json.loads(d.render("json"))
    assert data["counts"] == d.counts()
    assert len(data["entries"]) == len(d)
    assert data["first_divergence"]["module"] == "blocks.1.feed_forward.linear1"
    md = d.render("md")
    assert "First divergence (atol=0): **blocks.1.feed_forward.linear1 · linear**" in md
    first = d.first_divergence()  # named by its step number, as the compare window counts
    assert f"(A#{first.a_index + 1}, changed)" in md
    changed_rows = [line for line in md.splitlines() if "| changed |" in line]
    changed_steps = {row.split("|")[1].strip() for row in changed_rows}  # a row per output
    assert len(changed_steps) == d.counts()["changed"]
    numbers = {e.a_index + 1 for e in d if e.status == "changed"}
    assert {int(n) for n in changed_steps} == numbers
    assert "| equal |" not in md and "| equal |" in d.render("md", all_steps=True)
    with pytest.raises(ValueError, match="unknown diff format"):
        d.render("xml")
    # a huge tolerance: nothing diverges
    assert "No divergence above atol=1e+06" in d.render("md", atol=1e6)


def test_json_encodes_non_finite_scores():
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    d = diff(tracing.trace(_TwoLayer(), x, capture="values"),
             tracing.trace(_TwoLayer(extra=True), x, capture="values"))  # fmt: skip
    data = json.loads(d.render("json"))  # strict JSON: no bare Infinity
    assert data["module_scores"]["extra"] == "inf"


# --------------------------------------------------------------------------- CLI


def test_cli_diff(value_traces, tmp_path, capsys):
    value_traces[0].save(tmp_path / "a.trace")
    value_traces[1].save(tmp_path / "b.trace")
    assert main(["diff", str(tmp_path / "a.trace"), str(tmp_path / "b.trace")]) == 0
    out = capsys.readouterr().out
    assert "blocks.1.feed_forward.linear1 · linear" in out
    out_file = tmp_path / "d.json"
    args = ["diff", str(tmp_path / "a.trace"), str(tmp_path / "b.trace"), "--format", "json"]
    assert main([*args, "-o", str(out_file)]) == 0
    assert json.loads(out_file.read_text())["counts"]["changed"] > 0
    assert "first divergence: blocks.1.feed_forward.linear1 · linear" in capsys.readouterr().err


def test_cli_diff_errors(tmp_path, capsys):
    assert main(["diff", str(tmp_path / "none.trace"), str(tmp_path / "x.trace")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.trace"
    bad.write_bytes(b"not a trace")
    assert main(["diff", str(bad), str(bad)]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_package_level_diff_is_the_function_even_after_importing_the_module() -> None:
    import tracing

    assert tracing.diff is tracing.trace_diff.diff
    assert callable(tracing.diff)
