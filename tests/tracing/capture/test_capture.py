"""The capture engine: module and op steps, identity, levels, source lines, failures."""

from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch
import torch.nn.functional as F
from helpers.tiny_models import tiny_config
from torch import nn

import tracing
from tracing.capture.tracer import Tracer
from tracing.dims.letters import house_sizes


def tiny_model():
    from scratchformer import DecoderOnlyTransformer

    # sizes chosen distinct so every axis has one name: B=2 T=7 C=32 H=4 D=8 V=50 F=64
    return DecoderOnlyTransformer(tiny_config(dropout=0.1))


@pytest.fixture
def model():
    return tiny_model().eval()


@pytest.fixture
def tokens():
    return torch.randint(0, 50, (2, 7))


def shapes_of(trace, step):
    return [trace.tensor(i).shape for i in step.outputs]


# --------------------------------------------------------------------------- structure


def test_every_module_that_runs_has_a_step_before_its_ops(model, tokens):
    t = tracing.trace(model, tokens, capture="shapes")
    ran = {s.module for s in t.steps if s.kind == "module"}
    assert ran == {p for p, _ in model.named_modules()} - {"blocks"}  # ModuleList never runs
    for step in t.steps:
        if step.parent is not None:
            parent = t.steps[step.parent]
            assert parent.kind == "module"
            assert parent.index < step.index <= parent.end
            assert step.depth == parent.depth + 1
        if step.kind == "op":
            assert step.module == t.steps[step.parent].module
    root = t.steps[0]
    assert root.module == "" and root.depth == 0 and root.end == len(t.steps) - 1


def test_split_heads_shows_view_then_transpose_with_dims(model, tokens):
    t = tracing.trace(model, tokens, capture="shapes")
    ops = [s for s in t.steps if s.module == "blocks.0.self_attn" and s.kind == "op"]
    split = [s for s in ops if s.source and s.source.function == "split_heads"]
    assert [s.op for s in split] == ["view", "transpose"] * 3
    view, transpose = split[0], split[1]
    assert t.tensor(view.inputs[0]).dims == ("B", "T", "C")
    assert t.tensor(view.outputs[0]).dims == ("B", "T", "H", "D")
    assert t.tensor(transpose.outputs[0]).dims == ("B", "H", "T", "D")
    assert t.tensor(transpose.outputs[0]).shape == (2, 4, 7, 8)
    # the transpose consumes exactly what the view produced
    assert transpose.inputs[0] == view.outputs[0]
    assert "view" in view.source.text and view.source.line > 0
    assert view.source.file.endswith("attention.py")


def test_ops_inside_attention_and_no_noise(model, tokens):
    t = tracing.trace(model, tokens, capture="shapes")
    sdpa = [s for s in t.steps if s.module == "blocks.0.self_attn.attention" and s.kind == "op"]
    names = [s.op for s in sdpa]
    for expected in ("transpose", "matmul", "div", "masked_fill", "softmax"):
        assert expected in names
    all_ops = {s.op for s in t.steps if s.kind == "op"}
    assert not all_ops & {"size", "dim", "shape", "__get__", "device", "__repr__"}
    # F.linear inside nn.Linear is exactly one op: its nested calls are not steps
    lin = [s for s in t.steps if s.module == "blocks.0.self_attn.W_q" and s.kind == "op"]
    assert [s.op for s in lin] == ["linear"]
    assert lin[0].input_names[1:] == (
        "blocks.0.self_attn.W_q.weight",
        "blocks.0.self_attn.W_q.bias",
    )
    assert t.tensor(lin[0].inputs[1]).role == "param"


def test_module_inputs_named_from_signature_and_outputs_named(model, tokens):
    t = tracing.trace(model, tokens, capture="shapes")
    mha = t.module_steps("blocks.0.self_attn")[0]
    assert mha.input_names[:3] == ("q", "k", "v")
    # q, k and v are the same tensor (norm1's output): one record
    assert mha.inputs[0] == mha.inputs[1] == mha.inputs[2]
    sdpa = t.module_steps("blocks.0.self_attn.attention")[0]
    assert sdpa.output_names == ("output[0]", "output[1]")
    assert t.steps[0].input_names == ("idx",)
    assert t.tensor(t.steps[0].inputs[0]).role == "input"


def test_module_output_is_its_last_ops_output(model, tokens):
    t = tracing.trace(model, tokens, capture="shapes")
    wq = t.module_steps("blocks.0.self_attn.W_q")[0]
    linear = t.steps[wq.index + 1]
    assert linear.op == "linear" and wq.outputs == linear.outputs
    record = t.tensor(wq.outputs[0])
    assert record.producer == linear.index  # the innermost step


def test_residual_add_consumes_block_input(model, tokens):
    t = tracing.trace(model, tokens, capture="shapes")
    block = t.module_steps("blocks.1")[0]
    adds = [s for s in t.children_of(block.index) if s.op == "add"]
    assert len(adds) == 2
    assert block.inputs[0] in adds[0].inputs  # x + dropout(attn(norm1(x)))
    assert adds[0].outputs[0] in adds[1].inputs


def test_shared_module_called_twice_gives_two_steps():
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(self.lin(x))

    m = Shared()
    t = tracing.trace(m, torch.randn(3, 4))
    calls = t.module_steps("lin")
    assert [s.call for s in calls] == [0, 1]
    assert calls[1].inputs == calls[0].outputs
    assert t.modules["lin"].params == 20 and t.modules[""].params_total == 20


def test_in_place_ops_make_new_ids():
    class InPlace(nn.Module):
        def __init__(self):
            super().__init__()
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            y = x * 2
            y.add_(1)
            y = self.relu(y)
            y.masked_fill_(y > 2, 0.0)
            y[0] = 5.0
            return y

    x = torch.randn(3, 4)
    t = tracing.trace(InPlace(), x, capture="values")
    ops = [s for s in t.steps if s.kind == "op"]
    assert [s.op for s in ops] == ["mul", "add_", "relu", "gt", "masked_fill_", "setitem"]
    mul, add_, relu, _, fill, setitem = ops
    assert add_.inputs[0] == mul.outputs[0] and add_.outputs[0] != mul.outputs[0]
    assert relu.inputs[0] == add_.outputs[0] and relu.outputs[0] != add_.outputs[0]
    assert setitem.outputs[0] != fill.outputs[0]
    # each version keeps the value it had then
    expected = x * 2
    assert torch.equal(t.value(mul.outputs[0]), expected)
    expected = expected + 1
    assert torch.equal(t.value(add_.outputs[0]), expected)
    assert torch.equal(t.value(relu.outputs[0]), expected.relu())


def test_keyword_only_and_nested_inputs_outputs():
    class KW(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, *, scale, extra=None):
            h = self.lin(x) * scale
            return {"logits": h, "pair": (h.sum(-1), extra["a"] + 1)}

    x, s = torch.randn(2, 4), torch.tensor(3.0)
    with Tracer(KW()) as tr:
        out = tr.model(x, scale=s, extra={"a": torch.ones(2)})
    t = tr.trace
    root = t.steps[0]
    assert root.input_names == ("x", "scale", "extra['a']")
    assert root.output_names == ("output['logits']", "output['pair'][0]", "output['pair'][1]")
    assert shapes_of(t, root) == [(2, 4), (2,), (2,)]
    assert tr.output is out


# --------------------------------------------------------------------------- levels


def test_stats_match_torch(model, tokens):
    t = tracing.trace(model, tokens, capture="values")
    for record in t.tensors:
        value = t.value(record.id)
        if value is None or record.stats is None or not value.is_floating_point():
            continue
        finite = value[torch.isfinite(value)].double()
        st = record.stats
        assert st.min == pytest.approx(finite.min().item())
        assert st.max == pytest.approx(finite.max().item())
        assert st.mean == pytest.approx(finite.mean().item(), abs=1e-5)
        assert st.std == pytest.approx(finite.std(correction=0).item(), rel=1e-4, abs=1e-6)
        assert st.nan == int(torch.isnan(value).sum())
        assert st.inf == int(torch.isinf(value).sum())
    # the causal mask made -inf scores: counted, and left out of min/mean
    masked = next(s for s in t.steps if s.op == "masked_fill")
    st = t.tensor(masked.outputs[0]).stats
    assert st.inf == 2 * 4 * (7 * 6 // 2) and math.isfinite(st.min)


def test_values_equal_module_outputs_seen_by_plain_hooks(model, tokens):
    seen: dict[str, list[torch.Tensor]] = {}

    def keep(path):
        def hook(module, args, output):
            first = output[0] if isinstance(output, tuple) else output
            seen.setdefault(path, []).append(first.detach().clone())

        return hook

    handles = [m.register_forward_hook(keep(p)) for p, m in model.named_modules()]
    with torch.no_grad():
        model(tokens)
    for h in handles:
        h.remove()
    t = tracing.trace(model, tokens, capture="values")
    checked = 0
    for step in t.steps:
        if step.kind == "module":
            assert torch.equal(t.value(step.outputs[0]), seen[step.module][step.call])
            checked += 1
    assert checked == sum(len(v) for v in seen.values())


def test_value_cap_and_dtype(model, tokens):
    t = tracing.trace(model, tokens, capture="values", value_dtype=torch.float16)
    logits = t.tensor(t.steps[0].outputs[0])
    assert t.value(logits.id).dtype == torch.float16
    assert t.value(t.steps[0].inputs[0]).dtype == torch.int64  # ints are not downcast
    capped = tracing.trace(model, tokens, capture="values", value_cap=2 * 7 * 32 * 4 - 1)
    big = [r for r in capped.tensors if r.numel * 4 > 2 * 7 * 32 * 4 - 1 and r.role is None]
    assert big and all(r.value_key is None for r in big if r.dtype == "float32")
    assert capped.meta["values_skipped"] > 0
    # attention maps are kept whatever the cap
    assert len(capped.attention_maps()) == 2


def test_shapes_level_keeps_no_activation_alive(model, tokens):
    refs = []

    def grab(module, args, output):
        refs.append(weakref.ref(output))

    handle = model.blocks[0].feed_forward.linear1.register_forward_hook(grab)
    t = tracing.trace(model, tokens, capture="shapes")
    handle.remove()
    gc.collect()
    assert refs and refs[0]() is None
    assert all(r.stats is None for r in t.tensors)
    assert set(t.values) == {r.value_key for r in t.tensors if r.role == "attention"}


def test_dims_from_config_and_coincident_sizes():
    from scratchformer import DecoderOnlyTransformer, ModelConfig

    # demo-like: V == F == 256 and T == D == 16
    config = ModelConfig(vocab_size=256, block_size=32, d_model=64, n_heads=4, n_layers=1, d_ff=256)
    m = DecoderOnlyTransformer(config).eval()
    t = tracing.trace(m, torch.randint(0, 256, (1, 16)), capture="shapes")
    assert t.meta["dims"] == {
        "B": 1,
        "T": 16,
        "C": 64,
        "H": 4,
        "D": 16,
        "V": 256,
        "F": 256,
        "N": 32,
    }
    assert t.tensor(t.steps[0].outputs[0]).dims == ("B", "T", "V")
    hidden = t.module_steps("blocks.0.feed_forward.linear1")[0]
    assert t.tensor(hidden.outputs[0]).dims == ("B", "T", "F")
    weights = t.module_steps("blocks.0.self_attn.attention")[0].outputs[1]
    assert t.tensor(weights).dims == ("B", "H", "T", "T")
    q = next(s for s in t.steps if s.op == "transpose" and s.module == "blocks.0.self_attn")
    assert t.tensor(q.outputs[0]).dims == ("B", "H", "T", "D")


def test_dims_helpers():
    config = {"n_embd": 48, "n_head": 4, "vocab_size": 10, "n_inner": None}
    assert house_sizes(config, None, (2, 5)) == {"C": 48, "F": 192, "D": 12, "B": 2, "T": 5}


def test_given_dims_override_and_meta(model, tokens):
    t = tracing.trace(model, tokens, dims={"T": 7, "B": 2}, meta={"text": "hi"})
    assert t.meta["text"] == "hi"
    assert t.meta["capture"] == "stats"
    assert t.meta["config"]["d_model"] == 32
    assert t.meta["model_class"].endswith("DecoderOnlyTransformer")
    assert t.meta["input_shapes"] == {"idx": [2, 7]}
    assert t.meta["torch_version"] == torch.__version__
    with pytest.raises(ValueError, match="capture must be one of"):
        tracing.trace(model, tokens, capture="everything")
    with pytest.raises(ValueError, match="dims"):
        tracing.trace(model, tokens, dims={"B": "two"})


def test_module_infos(model):
    t = tracing.trace(model, torch.randint(0, 50, (1, 3)), capture="shapes")
    assert list(t.modules) == [p for p, _ in model.named_modules()]
    assert t.modules[""].params_total == sum(p.numel() for p in model.parameters())
    lin = t.modules["blocks.0.self_attn.W_q"]
    assert lin.params == 32 * 32 + 32 and lin.parent == "blocks.0.self_attn"
    assert "in_features=32" in lin.extra
    assert "blocks.0.self_attn.attention" in t.modules["blocks.0.self_attn"].children


# --------------------------------------------------------------------------- modes


def test_eval_by_default_training_restored_and_train_option(model, tokens):
    model.train()
    model.blocks[0].eval()  # a mixed state must come back exactly
    t = tracing.trace(model, tokens, capture="values")
    assert model.training and not model.blocks[0].training and model.blocks[1].training
    drop = next(s for s in t.steps if s.op == "dropout")
    assert torch.equal(t.value(drop.outputs[0]), t.value(drop.inputs[0]))  # eval: identity
    t2 = tracing.trace(model, tokens, capture="values", train=True)
    assert t2.meta["training"] is True
    drop = next(s for s in t2.steps if s.op == "dropout")
    assert not torch.equal(t2.value(drop.outputs[0]), t2.value(drop.inputs[0]))


def test_ops_outside_the_model_are_not_recorded(model, tokens):
    with Tracer(model, capture="shapes") as tr:
        logits = model(tokens)
        probs = logits.softmax(-1)
    assert probs.shape == (2, 7, 50)
    assert "softmax" not in {s.op for s in tr.trace.steps if s.depth == 1}
    assert sum(1 for s in tr.trace.steps if s.parent is None) == 1


# --------------------------------------------------------------------------- failure


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 5)
        self.second = nn.Linear(4, 3)

    def forward(self, x):
        y = self.first(x)
        y = F.relu(y)
        return self.second(y)  # 5 features into a 4-feature layer


def test_failure_gives_partial_trace_and_cleans_up():
    m = Broken().train()
    with pytest.raises(tracing.TraceError) as info:
        tracing.trace(m, torch.randn(2, 4))
    err = info.value
    assert isinstance(err.__cause__, RuntimeError)
    assert "second" in str(err) and "linear" in str(err) and "self.second(y)" in str(err)
    t = err.trace
    assert t.error and not t.complete
    assert [(s.module, s.op) for s in t.steps] == [
        ("", "Broken"),
        ("first", "Linear"),
        ("first", "linear"),
        ("", "relu"),
        ("second", "Linear"),
        ("second", "linear"),
    ]
    failing = t.steps[-1]
    assert (
        failing.error
        and failing.source.text == "return self.second(y)  # 5 features into a 4-feature layer"
    )
    assert [t.tensor(i).shape for i in failing.inputs] == [(2, 5), (3, 4), (3,)]
    assert t.steps[0].error and t.steps[4].error and t.steps[1].error is None
    # everything restored
    assert m.training
    for module in m.modules():
        assert not module._forward_hooks and not module._forward_pre_hooks
    assert not torch.overrides._get_current_function_mode_stack()


def test_failure_raised_by_python_code_names_the_module_and_line():
    class Checks(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(2, 2))

        def forward(self, x):
            x = self.inner(x)
            if x.shape[-1] != 3:
                raise ValueError("expected 3 features")
            return x

    with pytest.raises(tracing.TraceError, match="expected 3 features") as info:
        tracing.trace(Checks(), torch.randn(1, 2))
    assert 'raise ValueError("expected 3 features")' in str(info.value)
    assert info.value.trace.steps[0].error


def test_tracer_is_reusable_and_hooks_are_removed(model, tokens):
    tracer = Tracer(model, capture="shapes")
    for _ in range(2):
        with tracer:
            model(tokens)
        assert len(tracer.trace.steps) > 50
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
    with pytest.raises(TypeError, match=r"nn\.Module"):
        Tracer(lambda x: x)


# --------------------------------------------------------------------------- stats


@pytest.mark.parametrize(
    "values",
    [
        [1.0, 2.0, 4.0],
        [1.0, float("-inf"), 3.0, float("inf")],
        [float("nan"), 2.0, float("-inf"), 5.0, 1.0],
        [float("nan"), float("inf")],
        [7.0],
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_tensor_stats_against_numpy_style_reference(values, dtype):
    from tracing.stats import tensor_stats

    t = torch.tensor(values, dtype=dtype).repeat(3, 1).t()  # non-contiguous on purpose
    st = tensor_stats(t)
    flat = t.reshape(-1).double()
    finite = flat[torch.isfinite(flat)]
    assert st.nan == int(torch.isnan(flat).sum()) and st.inf == int(torch.isinf(flat).sum())
    if finite.numel() == 0:
        assert math.isnan(st.min) and math.isnan(st.mean)
        return
    assert st.min == finite.min().item() and st.max == finite.max().item()
    assert st.mean == pytest.approx(finite.mean().item(), rel=1e-3)
    assert st.std == pytest.approx(finite.std(correction=0).item(), rel=1e-3, abs=1e-6)


def test_tensor_stats_integer_bool_and_empty():
    from tracing.stats import tensor_stats

    st = tensor_stats(torch.arange(10))
    assert (st.min, st.max, st.mean) == (0, 9, 4.5)
    assert st.std == pytest.approx(torch.arange(10.0).std(correction=0).item())
    assert tensor_stats(torch.tensor([True, False, True, True])).mean == 0.75
    assert tensor_stats(torch.empty(0, 3)) is None


def test_ops_in_a_user_subclass_of_a_torch_module_get_their_own_line():
    class Scaled(nn.Linear):
        def forward(self, x):
            y = super().forward(x)
            return y * 2  # the line the mul step must point at

    t = tracing.trace(Scaled(3, 3), torch.randn(2, 3))
    mul = next(s for s in t.steps if s.op == "mul")
    assert mul.source.text.startswith("return y * 2")
    linear = next(s for s in t.steps if s.op == "linear")
    assert linear.source.text == "y = super().forward(x)"


def test_first_tensor_is_input_for_functions_and_self_for_methods():
    class Net(nn.Module):
        def forward(self, x):
            y = F.softmax(x, dim=-1)  # a function: "input"
            z = torch.matmul(y, x)  # a function: "input", "arg1"
            return z.view(-1)  # a method: "self"

    t = tracing.trace(Net(), torch.randn(3, 3), capture="shapes")
    names = {s.op: s.input_names for s in t.steps if s.kind == "op"}
    assert names["softmax"] == ("input",)
    assert names["matmul"] == ("input", "arg1")
    assert names["view"] == ("self",)


# --------------------------------------------------------------------------- instruments


def test_a_traced_model_is_not_kept_alive_by_the_tracer(tokens):
    model = tiny_model().eval()
    for level in ("shapes", "stats"):
        tracing.trace(model, tokens, capture=level)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_no_per_model_cache_grows_with_the_models_traced(tokens):
    """Everything the tracer keeps per model lives on its ``_Structure``, which goes when
    the model goes: tracing many models leaves no module-level table any larger."""
    from tracing import capture

    def table_sizes():
        return {
            name: len(value)
            for name, value in vars(capture).items()
            if not name.startswith("__")
            and isinstance(value, (dict, list, set, weakref.WeakKeyDictionary))
        }

    tracing.trace(tiny_model().eval(), tokens, capture="stats")  # warm the per-op tables
    gc.collect()
    before = table_sizes()
    refs = []
    for _ in range(3):
        model = tiny_model().eval()
        tracing.trace(model, tokens, capture="stats")
        refs.append(weakref.ref(model))
        del model
    gc.collect()
    assert [ref() for ref in refs] == [None, None, None]
    assert table_sizes() == before


def test_user_hooks_rewrite_what_the_module_step_records():
    """A user's pre-hook and hook change a module's input and output: the module step
    shows what the module really received and returned, as plain hooks see it."""
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    x = torch.randn(5, 3)
    seen = {}
    model[1].register_forward_pre_hook(lambda m, args: (args[0] * 0 - 1,))
    model[1].register_forward_hook(lambda m, args, out: out + 10)
    model[2].register_forward_hook(lambda m, args, out: seen.setdefault("out", out.clone()))
    model[2].register_forward_pre_hook(lambda m, args: seen.setdefault("in", args[0].clone()))
    reference = model(x)
    t = tracing.trace(model, x, capture="values")
    relu = next(s for s in t.steps if s.kind == "module" and s.module == "1")
    assert torch.equal(t.value(relu.inputs[0]), torch.full((5, 4), -1.0))
    assert torch.equal(t.value(relu.outputs[0]), torch.full((5, 4), 10.0))
    last = next(s for s in t.steps if s.kind == "module" and s.module == "2")
    assert torch.equal(t.value(last.inputs[0]), seen["in"])
    assert torch.equal(t.value(t.steps[0].outputs[0]), reference)
    for m in model.modules():  # ours are gone, the user's stay
        assert len(m._forward_hooks) == (1 if m in (model[1], model[2]) else 0)
        assert "forward" not in vars(m)


def test_tracing_twice_reuses_nothing_stale():
    """Wrappers are reused between traces of one model: a changed class forward, a
    replaced submodule and a new parameter each show up in the next trace."""

    class Double(nn.Module):
        def forward(self, x):
            return x * 2

    model = nn.Sequential(Double(), nn.Linear(3, 3)).eval()
    x = torch.randn(2, 3)
    first = tracing.trace(model, x, capture="shapes")
    again = tracing.trace(model, x, capture="shapes")
    assert [(s.module, s.op) for s in again.steps] == [(s.module, s.op) for s in first.steps]

    Double.forward = lambda self, x: x + 1  # patched on the class between traces
    patched = tracing.trace(model, x, capture="shapes")
    assert [s.op for s in patched.steps if s.module == "0"] == ["Double", "add"]

    model[1] = nn.Linear(3, 5)
    swapped = tracing.trace(model, x, capture="shapes")
    assert swapped.tensor(swapped.steps[-1].outputs[0]).shape == (2, 5)
    assert swapped.modules["1"].params_total == 3 * 5 + 5
    assert "forward" not in vars(model[0]) and "forward" not in vars(model[1])


def test_an_op_that_returns_no_tensor_leaves_no_record():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.reference = torch.ones(3)  # a plain attribute: not seen before torch.equal

        def forward(self, x):
            same = torch.equal(self.reference, x[0])  # returns a bool: no step
            return x * 2 if same else x * 3

    t = tracing.trace(Net(), torch.ones(2, 3), capture="stats")
    used = {i for s in t.steps for i in (*s.inputs, *s.outputs)}
    assert used == set(range(len(t.tensors)))
    assert [s.op for s in t.steps if s.kind == "op"] == ["getitem", "mul"]


def test_nested_tracers_on_one_model_both_record_and_leave_nothing():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU()).eval()
    with torch.no_grad(), Tracer(model, "shapes") as outer, Tracer(model, "shapes") as inner:
        model(torch.randn(2, 3))
    expected = [("", "Sequential"), ("0", "Linear"), ("0", "linear"), ("1", "ReLU"), ("1", "relu")]
    assert [(s.module, s.op) for s in inner.trace.steps] == expected
    assert [(s.module, s.op) for s in outer.trace.steps] == expected
    assert not any("forward" in vars(m) for m in model.modules())
    assert len(tracing.trace(model, torch.randn(2, 3), capture="shapes").steps) == 5


def test_value_is_none_when_no_copy_was_kept_or_its_entry_is_gone(model, tokens):
    t = tracing.trace(model, tokens, capture="values")
    kept = next(r for r in t.tensors if r.value_key is not None)
    assert torch.is_tensor(t.value(kept.id))
    del t.values[kept.value_key]
    assert t.value(kept.id) is None
    shapes = tracing.trace(model, tokens, capture="shapes")
    assert all(shapes.value(r.id) is None for r in shapes.tensors if r.role != "attention")


def test_frozen_records_are_those_their_constructors_make(model, tokens):
    """Records are built without their dataclass ``__init__`` (``record.built``): every
    field is set, and each equals, hashes and prints as its constructor's."""
    import dataclasses

    t = tracing.trace(model, tokens, capture="stats")
    for record in [*t.steps, *t.tensors, *(r.stats for r in t.tensors if r.stats)]:
        fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
        assert set(vars(record)) == set(fields)
        rebuilt = type(record)(**fields)
        assert rebuilt == record and hash(rebuilt) == hash(record)
        assert repr(rebuilt) == repr(record)


def test_a_trace_is_freed_without_the_cyclic_collector(model, tokens):
    """Nothing of the tracer keeps a finished trace in a reference cycle: dropping it
    frees it (and its values' memory) at once, not at the next full collection."""
    gc.disable()
    try:
        for level in ("shapes", "stats", "values"):
            ref = weakref.ref(tracing.trace(model, tokens, capture=level))
            assert ref() is None, level
    finally:
        gc.enable()


def test_a_trace_leaves_the_collector_on_and_thaws_no_heap_it_did_not_freeze():
    """The trace's objects are made old at its end (frozen then thawed at once); a heap
    someone keeps frozen (the app's ``long_lived``) stays frozen, with the trace's in it."""
    import gc

    model, x = torch.nn.Linear(4, 3), torch.randn(2, 4)
    gc.unfreeze()
    tracing.trace(model, x, capture="shapes")
    assert gc.isenabled() and gc.get_freeze_count() == 0
    kept = [[i] for i in range(1000)]
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        tracing.trace(model, x, capture="shapes")
        assert gc.isenabled() and gc.get_freeze_count() > before
    finally:
        gc.unfreeze()
        del kept
