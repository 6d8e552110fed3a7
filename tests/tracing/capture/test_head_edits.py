"""Head edits on torch's own attention (tracing.capture.heads): zeroing head h of an
``nn.MultiheadAttention`` equals zeroing that head's columns of ``out_proj.weight`` (weight
surgery, an independent path), in a trace and in a hooks-only run, whatever ``batch_first``
and ``need_weights`` say, alone and inside ``nn.TransformerEncoder/Decoder``."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tracing
from tracing.capture.edits import Edit, EditError, MeanAblate, Patch, Scale, Zero
from tracing.runs.edit_run import run_edited
from tracing.runs.patching import head_sites, sweep

E, H = 16, 4
D = E // H


class Attn(nn.Module):
    """One ``nn.MultiheadAttention``, self-attention, with or without weights asked for."""

    def __init__(self, batch_first: bool, need_weights: bool):
        super().__init__()
        self.batch_first, self.need_weights = batch_first, need_weights
        self.attn = nn.MultiheadAttention(E, H, batch_first=batch_first)

    def forward(self, x):  # x: (B, T, E)
        if not self.batch_first:
            x = x.transpose(0, 1)
        out, _ = self.attn(x, x, x, need_weights=self.need_weights, average_attn_weights=False)
        return out if self.batch_first else out.transpose(0, 1)


class Decoder(nn.Module):
    def __init__(self, layers: int = 2, batch_first: bool = True):
        super().__init__()
        self.emb = nn.Embedding(30, E)
        layer = nn.TransformerDecoderLayer(E, H, 32, dropout=0.0, batch_first=batch_first)
        self.dec = nn.TransformerDecoder(layer, layers)
        self.batch_first = batch_first
        self.head = nn.Linear(E, 30)

    def forward(self, ids):
        h = self.emb(ids)
        if not self.batch_first:
            h = h.transpose(0, 1)
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        out = self.dec(h, h, tgt_mask=mask)
        return self.head(out if self.batch_first else out.transpose(0, 1))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, E)
        layer = nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(E, 30)

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids)))


def _surgery(model: nn.Module, path: str, head: int) -> nn.Module:
    """A copy of ``model`` with head ``head``'s columns of ``path.out_proj.weight`` zeroed."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.get_submodule(path).out_proj.weight[:, head * D : (head + 1) * D] = 0
    return other


def _out(t):
    return t.value(t.steps[0].outputs[0])


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_zeroing_a_head_is_zeroing_its_out_proj_columns(batch_first, need_weights):
    torch.manual_seed(0)
    model = Attn(batch_first, need_weights).eval()
    x = torch.randn(2, 5, E)
    with torch.no_grad():
        for head in range(H):
            expected = _surgery(model, "attn", head)(x)
            edit = Edit("attn", Zero(), head=head)
            hooked = run_edited(model, x, edits=[edit])
            traced = _out(tracing.trace(model, x, capture="values", edits=[edit]))
            torch.testing.assert_close(hooked, expected, rtol=0, atol=1e-6)
            torch.testing.assert_close(traced, expected, rtol=0, atol=1e-6)
            assert not torch.equal(hooked, model(x))  # the head did something


@pytest.mark.parametrize("batch_first", [True, False])
def test_scale_one_changes_nothing_bit_for_bit(batch_first):
    torch.manual_seed(1)
    model = Decoder(batch_first=batch_first).eval()
    ids = torch.randint(0, 30, (2, 6))
    edits = [Edit("dec.layers.1.self_attn", Scale(1.0), head=2)]
    with torch.no_grad():
        plain = model(ids)
        assert torch.equal(run_edited(model, ids, edits=edits), plain)
    traced = tracing.trace(model, ids, capture="values", edits=edits)
    assert torch.equal(_out(traced), plain)
    assert traced.meta["edits"][0]["steps"]  # it applied, at the attention's call


@pytest.mark.parametrize("which", ["self_attn", "multihead_attn"])
def test_decoder_head_zero_matches_surgery(which):
    torch.manual_seed(2)
    model = Decoder().eval()
    ids = torch.randint(0, 30, (1, 7))
    path = f"dec.layers.1.{which}"
    with torch.no_grad():
        expected = _surgery(model, path, 3)(ids)
        hooked = run_edited(model, ids, edits=[Edit(path, Zero(), head=3)])
    traced = _out(tracing.trace(model, ids, capture="values", edits=[Edit(path, Zero(), head=3)]))
    torch.testing.assert_close(hooked, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(traced, expected, rtol=0, atol=1e-6)


def test_encoder_head_zero_matches_surgery_under_no_grad():
    """Under no_grad in eval, nn.TransformerEncoderLayer takes its fused fast path, which
    never calls the attention module: the edit must still apply (or say it did not)."""
    torch.manual_seed(3)
    model = Encoder().eval()
    ids = torch.randint(0, 30, (2, 5))
    path = "enc.layers.0.self_attn"
    with torch.no_grad():
        expected = _surgery(model, path, 1)(ids)
        hooked = run_edited(model, ids, edits=[Edit(path, Zero(), head=1)])
    torch.testing.assert_close(hooked, expected, rtol=0, atol=1e-6)


def test_mean_ablate_and_patch_on_a_head():
    torch.manual_seed(4)
    model = Attn(True, False).eval()
    x = torch.randn(3, 4, E)
    with torch.no_grad():
        mean = run_edited(model, x, edits=[Edit("attn", MeanAblate(over="batch"), head=0)])
        assert not torch.equal(mean, model(x))
        # a patch of the head's own value (B, H, T, D) from a dict changes nothing
        kept = {}
        from tracing.runs.patching import _Keep

        run_edited(model, x, edits=[Edit("attn", _Keep(kept), head=slice(None))])
        assert kept["attn@0"].shape == (3, H, 4, D)
        same = run_edited(model, x, edits=[Edit("attn", Patch(kept), head=1)])
        assert torch.equal(same, run_edited(model, x, edits=[Edit("attn", Scale(1.0), head=1)]))
    # not bit for bit against model(x) itself here: under no_grad a batch_first attention
    # takes torch's fused fast path, whose rounding differs; the edit runs the composite
    # path (the one tracing.trace and autograd run), and changes nothing against it
    plain = _out(tracing.trace(model, x, capture="values"))
    assert torch.equal(same, plain)


def test_heads_sweep_on_a_decoder_has_self_and_cross_attention():
    torch.manual_seed(5)
    model = Decoder().eval()
    clean = torch.randint(0, 30, (1, 6))
    corrupted = clean.clone()
    corrupted[0, 2] = (corrupted[0, 2] + 1) % 30
    structure = tracing.trace(model, clean, capture="shapes")
    assert [s.module for s, _ in head_sites(structure)] == [
        "dec.layers.0.self_attn", "dec.layers.0.multihead_attn",
        "dec.layers.1.self_attn", "dec.layers.1.multihead_attn",
    ]  # fmt: skip
    result = sweep(model, clean, corrupted, over="heads")
    assert result.rows == [
        "dec.layers.0.self_attn", "dec.layers.0.multihead_attn",
        "dec.layers.1.self_attn", "dec.layers.1.multihead_attn",
    ]  # fmt: skip
    assert result.columns == [f"head {h}" for h in range(H)]
    assert torch.isfinite(result.values).all() and result.runs == 4 * H
    # a cell is the corrupted run with that head's output from the clean run: patching
    # every head of a layer's self-attention gives its clean output there
    assert not torch.equal(result.values[0], torch.full((H,), result.corrupted_metric))


def test_module_path_without_heads_resolves_to_the_site_inside():
    """Our MultiHeadAttention returns (B, T, C): head= on it edits the per-head output of
    its ScaledDotProductAttention, exactly as addressing that module does."""
    import scratchformer

    model = scratchformer.demo_model()
    ids = torch.tensor([[1, 2, 3, 4]])
    inner = Edit("blocks.1.self_attn.attention", Zero(), head=1)
    outer = Edit("blocks.1.self_attn", Zero(), head=1)
    with torch.no_grad():
        assert torch.equal(
            run_edited(model, ids, edits=[outer]), run_edited(model, ids, edits=[inner])
        )
    t = tracing.trace(model, ids, capture="shapes", edits=[outer])
    (entry,) = t.meta["edits"]
    assert (entry["site"], entry["via"]) == ("blocks.1.self_attn.attention", "blocks.1.self_attn")
    # a module with no attention inside is still an error, naming what it holds
    with pytest.raises(tracing.TraceError, match="no attention map was recorded inside"):
        tracing.trace(
            model, ids, capture="shapes", edits=[Edit("blocks.1.feed_forward", Zero(), head=1)]
        )


def test_head_on_a_softmax_is_refused_unless_on_weights():
    with pytest.raises(EditError, match=r"attention \*weights\*.*on='weights'"):
        Edit("blocks.1.self_attn.attention:softmax#0", Zero(), head=1)
    edit = Edit("blocks.1.self_attn.attention:softmax#0", Zero(), head=1, on="weights")
    assert edit.describe().endswith("head 1 (weights)")


@pytest.mark.parametrize("need_weights", [True, False])
def test_a_trace_records_the_heads_of_each_call(need_weights):
    """The MHA step holds the per-head output (B, H, T, D): the merged heads before
    out_proj, as an independent computation from the module's weights gives them."""
    torch.manual_seed(6)
    model = Attn(True, need_weights).eval()
    x = torch.randn(2, 5, E)
    t = tracing.trace(model, x, capture="values")
    (step,) = [s for s in t.steps if s.op == "multi_head_attention_forward"]
    names = ("output[1]", "head_outputs") if need_weights else ("head_outputs", "attention_weights")
    assert step.output_names[1:] == names  # the weights: returned, or rebuilt
    heads = t.value(step.outputs[step.output_names.index("head_outputs")])
    weights = t.value(step.outputs[2 if not need_weights else 1])  # (B, H, T, T)
    assert t.tensor(step.outputs[2 if not need_weights else 1]).role == "attention"
    attn = model.attn
    v = x @ attn.in_proj_weight[2 * E :].T + attn.in_proj_bias[2 * E :]  # (B, T, E)
    expected = weights @ v.view(2, 5, H, D).transpose(1, 2)  # (B, H, T, D)
    torch.testing.assert_close(heads, expected.detach(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("need_weights", [True, False])
def test_patch_and_mean_ablate_of_a_head_from_a_saved_trace(tmp_path, need_weights):
    torch.manual_seed(7)
    model = Attn(True, need_weights).eval()
    clean, corrupted = torch.randn(1, 5, E), torch.randn(1, 5, E)
    path = tmp_path / "clean.sft"
    tracing.trace(model, clean, capture="values").save(path)
    saved = tracing.load(path)
    kept = {}
    from tracing.runs.patching import _Keep

    with torch.no_grad():
        run_edited(model, clean, edits=[Edit("attn", _Keep(kept), head=slice(None))])
        for head in range(H):
            from_trace = run_edited(model, corrupted, edits=[Edit("attn", Patch(saved), head=head)])
            from_dict = run_edited(model, corrupted, edits=[Edit("attn", Patch(kept), head=head)])
            torch.testing.assert_close(from_trace, from_dict, rtol=0, atol=1e-6)
        # every head patched: the clean run's output
        every = run_edited(model, corrupted, edits=[Edit("attn", Patch(saved), head=slice(None))])
        torch.testing.assert_close(every, _out(tracing.trace(model, clean, capture="values")))
        # a reference trace's mean over its batch, per head
        refs = torch.randn(4, 5, E)
        ref_trace = tracing.trace(model, refs, capture="values")
        mean = run_edited(model, corrupted, edits=[Edit("attn", MeanAblate(ref_trace), head=2)])
        ref_heads = {}
        run_edited(model, refs, edits=[Edit("attn", _Keep(ref_heads), head=slice(None))])
        patched = ref_heads["attn@0"].mean(dim=0, keepdim=True)
        by_hand = run_edited(
            model, corrupted, edits=[Edit("attn", Patch({"attn": patched}), head=2)]
        )
        torch.testing.assert_close(mean, by_hand, rtol=0, atol=1e-6)
    # an edited trace records the edited heads
    zeroed = tracing.trace(model, clean, capture="values", edits=[Edit("attn", Zero(), head=1)])
    (step,) = [s for s in zeroed.steps if s.op == "multi_head_attention_forward"]
    heads = zeroed.value(step.outputs[step.output_names.index("head_outputs")])
    assert torch.count_nonzero(heads[:, 1]) == 0 and torch.count_nonzero(heads[:, 0]) > 0


def test_a_head_patch_from_a_trace_without_values_says_what_capture_is_needed():
    model = Attn(True, False).eval()
    x = torch.randn(1, 4, E)
    stats = tracing.trace(model, x, capture="stats")
    with pytest.raises(EditError, match=r"per-head output .*capture='values'"), torch.no_grad():
        run_edited(model, x, edits=[Edit("attn", Patch(stats), head=0)])
