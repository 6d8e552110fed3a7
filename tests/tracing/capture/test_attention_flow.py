"""Attention recognised by what it does (``tracing/attention_flow.py``), on an attention
written with ``einsum`` here: an ``Attend`` helper module runs the softmax between two
einsums, heads in a ``b h i j`` layout, as x-transformers does. No module's name says
attention where the softmax runs, so only the data flow can find the map.

The references are independent of the tracer: the map is ``softmax(q kᵀ · scale)``
computed from the weights; a head edit is weight surgery (that head's input columns of the
output projection zeroed); a sweep cell is a run with a forward hook that puts one head of
the clean run into the corrupted one.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch import nn

import tracing
from tracing.attention_flow import (
    carries_map,
    contracts_key,
    einsum_terms,
    per_head_output,
    softmax_axis,
)
from tracing.capture.edits import Edit, Zero
from tracing.runs.patching import sweep

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, C, H, D, LAYERS = 256, 24, 4, 6, 2


# --------------------------------------------------------------------------- the model


class Attend(nn.Module):
    """softmax(q kᵀ · scale) v, with einsum; the map never leaves this module."""

    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, q, k, v):
        sim = torch.einsum("b h i d, b h j d -> b h i j", q, k) * self.scale
        causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1)
        sim = sim.masked_fill(causal, float("-inf"))
        weights = sim.softmax(dim=-1)
        return torch.einsum("b h i j, b h j d -> b h i d", weights, v)


class Mixer(nn.Module):
    """Multi-head self-attention around :class:`Attend`: heads split and merged by hand."""

    def __init__(self):
        super().__init__()
        self.to_qkv = nn.Linear(C, 3 * H * D, bias=False)
        self.attend = Attend(D**-0.5)
        self.to_out = nn.Linear(H * D, C)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.to_qkv(x).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)  # (B, H, T, D)
        out = self.attend(q, k, v)  # (B, H, T, D)
        return self.to_out(out.transpose(1, 2).reshape(B, T, H * D))


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(C)
        self.mix = Mixer()
        self.ff = nn.Sequential(nn.Linear(C, 2 * C), nn.GELU(), nn.Linear(2 * C, C))

    def forward(self, x):
        x = x + self.mix(self.norm(x))
        return x + self.ff(x)


class EinsumLM(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, C)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.head = nn.Linear(C, VOCAB)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.fixture(scope="module")
def model():
    return EinsumLM().eval()


def _ids(text: str = "wordplay") -> torch.Tensor:
    return torch.tensor([list(text.encode())])


def _reference_map(model, ids, layer: int) -> torch.Tensor:
    """softmax(q kᵀ · scale) of ``layer``, from the weights and the layer's input."""
    inputs = {}
    mix = model.layers[layer].mix
    handle = mix.register_forward_pre_hook(lambda m, args: inputs.setdefault("x", args[0]))
    with torch.no_grad():
        model(ids)
    handle.remove()
    x = inputs["x"]
    T = x.shape[1]
    w_q, w_k, _ = mix.to_qkv.weight.view(3, H, D, C)
    q = torch.einsum("btc,hdc->bhtd", x, w_q)
    k = torch.einsum("btc,hdc->bhtd", x, w_k)
    scores = q @ k.transpose(-1, -2) / D**0.5
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1)


# --------------------------------------------------------------------------- the rule


def test_einsum_contracts_the_key_axis_with_values_and_keeps_the_query():
    assert contracts_key("einsum", ("b h i j, b h j d -> b h i d",), 0, 2)
    assert contracts_key("einsum", ("bhij,bjd->bhid",), 0, 2)  # one key/value head (MQA)
    assert contracts_key("einsum", ("...ij,...jd",), 0, 2)  # implicit output: ...id
    assert contracts_key("einsum", ("b j d, b h i j -> b h i d",), 1, 2)  # map second
    # a router's gates summed over experts per token: the token axis is in the values too
    assert not contracts_key("einsum", ("bte,bted->btd",), 0, 2)
    # the map's query axis summed (kᵀ-side use), or the key axis kept
    assert not contracts_key("einsum", ("bhij,bhid->bhjd",), 0, 2)
    assert not contracts_key("einsum", ("bhij,bhjd->bhijd",), 0, 2)
    assert contracts_key("matmul", (), 0, 2) and not contracts_key("matmul", (), 1, 2)
    assert einsum_terms("ij,jk", 2) == (["ij", "jk"], "ik")
    assert einsum_terms("ij,jk->ik", 3) is None


def test_ops_that_carry_a_map_and_the_softmax_axis():
    assert carries_map("dropout", (2, 4, 5, 5), (2, 4, 5, 5))
    assert carries_map("getitem", (2, 4, 5, 5), (2, 4, 5, 6))  # a sink column dropped
    assert not carries_map("getitem", (4, 5, 5), (2, 4, 5, 5))  # one batch row: not all heads
    assert carries_map("view", (8, 5, 5), (2, 4, 5, 5))  # heads folded into the batch
    assert not carries_map("view", (2, 20, 5), (2, 4, 5, 5))
    assert not carries_map("add", (2, 4, 5, 5), (2, 4, 5, 5))  # changed: no longer the map
    assert softmax_axis((None, -1), None, 4) == 3
    assert softmax_axis((None,), {"dim": 1}, 4) == 1
    assert softmax_axis((None,), None, 4) is None


class _OneHead(nn.Module):
    """Single-head attention with einsum, ``(B, T, S)``: no heads axis at all."""

    def __init__(self):
        super().__init__()
        self.emb, self.qkv = nn.Embedding(VOCAB, C), nn.Linear(C, 3 * C)

    def forward(self, ids):
        q, k, v = self.qkv(self.emb(ids)).chunk(3, -1)
        p = torch.einsum("bid,bjd->bij", q, k).mul(C**-0.5).softmax(-1)
        return torch.einsum("bij,bjd->bid", p, v)


def test_a_single_heads_map_is_shown_with_one_head():
    model = _OneHead().eval()
    ids = torch.randint(0, VOCAB, (2, 7))
    t = tracing.trace(model, ids, capture="shapes")
    (got,) = t.attention_maps().values()
    q, k, _ = model.qkv(model.emb(ids)).detach().chunk(3, -1)
    want = (q @ k.transpose(-1, -2) / C**0.5).softmax(-1).unsqueeze(1)
    assert got.shape == (2, 1, 7, 7)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class _NotMaps(nn.Module):
    """Softmaxes that look like maps but attend nothing: a router's gates mixed per token,
    a last-axis softmax reduced by mul + sum, and one whose query axis is summed."""

    def forward(self, x):  # x: (B, T, E, D)
        gates = x.mean(-1).softmax(-1)  # (B, T, E)
        routed = torch.einsum("bte,bted->btd", gates, x)
        scores = torch.einsum("bted,bsed->bets", x, x).softmax(-1)  # (B, E, T, S)
        pooled = (scores.unsqueeze(-1) * x.permute(0, 2, 1, 3).unsqueeze(2)).sum(-2)
        summed = torch.einsum("bets,betd->besd", scores, x.transpose(1, 2))
        return routed, pooled, summed


class _EntropyFirst(Attend):
    """An attention that reads its map's entropy with an einsum before it mixes the values."""

    def forward(self, q, k, v):
        p = torch.einsum("bhid,bhjd->bhij", q, k).mul(self.scale).softmax(-1)
        self.entropy = -torch.einsum("bhij,bhij->bhi", p, p.log())  # the map, read otherwise
        return torch.einsum("bhij,bhjd->bhid", p, v)


def test_the_values_contraction_is_the_head_site_not_another_read_of_the_map():
    from tracing.capture.heads import head_sites_in

    mixer = Mixer().eval()
    mixer.attend = _EntropyFirst(D**-0.5)
    t = tracing.trace(mixer, torch.randn(2, 5, C), capture="shapes")
    assert list(t.attention_maps()) == ["attend"]
    ((site, output, heads),) = head_sites_in(t)
    assert (str(site), output, heads) == ("attend@0", 0, H)  # the module returns the einsum's
    assert [s.op for s in t.steps if s.module == "attend" and s.op == "einsum"] == ["einsum"] * 3
    assert per_head_output((2, 4, 5, 6), (2, 4, 5, 5))
    assert not per_head_output((2, 4, 5), (2, 4, 5, 5))


class _TimeFirst(Attend):
    """Mixes the values straight into ``(T, B, H, D)``, as XLNet does (``ibhd``)."""

    def forward(self, q, k, v):
        p = torch.einsum("bhid,bhjd->bhij", q, k).mul(self.scale).softmax(-1)
        return torch.einsum("bhij,bhjd->ibhd", p, v).permute(1, 2, 0, 3)


def test_a_values_contraction_without_heads_on_axis_1_is_a_map_but_no_head_site():
    """Its map is found; a head edit by path is refused with a reason rather than applied
    to axis 1 of ``(T, B, H, D)``, which is the batch (the old rule's site)."""
    mixer = Mixer().eval()
    mixer.attend = _TimeFirst(D**-0.5)
    x = torch.randn(2, 5, C)
    assert list(tracing.trace(mixer, x, capture="shapes").attention_maps()) == ["attend"]
    with pytest.raises(tracing.TraceError, match=r"does not lay out its output \(B, H, T, D\)"):
        tracing.trace(mixer, x, capture="shapes", edits=[Edit("", Zero(), head=1)])


def test_softmaxes_that_do_not_attend_are_not_maps():
    t = tracing.trace(_NotMaps(), torch.randn(2, 5, 3, 4), capture="shapes")
    assert sum(s.op == "softmax" for s in t.steps) == 2
    assert [r for r in t.tensors if r.role == "attention"] == []
    assert t.attention_maps() == {}


# --------------------------------------------------------------------------- the features


def test_an_einsum_attention_in_a_helper_module_gives_maps_equal_to_softmax_qk(model):
    ids = _ids()
    t = tracing.trace(model, ids, capture="shapes")
    maps = t.attention_maps()
    assert list(maps) == [f"layers.{i}.mix.attend" for i in range(LAYERS)]
    for i, got in enumerate(maps.values()):
        assert got.shape == (1, H, 8, 8)
        torch.testing.assert_close(got, _reference_map(model, ids, i), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layer,head", [(0, 1), (1, 3)])
def test_a_head_edit_by_the_attention_modules_path_equals_weight_surgery(model, layer, head):
    ids = _ids()
    path = f"layers.{layer}.mix"
    t = tracing.trace(model, ids, capture="values", edits=[Edit(path, Zero(), head=head)])
    surgery = copy.deepcopy(model)
    with torch.no_grad():
        surgery.layers[layer].mix.to_out.weight[:, head * D : (head + 1) * D] = 0
        want, plain = surgery(ids), model(ids)
    assert (want - plain).abs().max() > 1e-3  # the head mattered
    torch.testing.assert_close(t.value(t.steps[0].outputs[0]), want, rtol=0, atol=2e-6)
    (entry,) = t.meta["edits"]
    assert entry["via"] == path and entry["site"] == f"{path}.attend" and entry["steps"]


def _patched_run(model, clean, corrupted, layer: int, head: int) -> torch.Tensor:
    """The corrupted run with ``head`` of ``layer``'s per-head output from the clean run."""
    attend = model.layers[layer].mix.attend
    kept = {}
    handle = attend.register_forward_hook(lambda m, a, out: kept.setdefault("clean", out))
    with torch.no_grad():
        model(clean)
    handle.remove()

    def put(module, args, out):
        out = out.clone()
        out[:, head] = kept["clean"][:, head]
        return out

    handle = attend.register_forward_hook(put)
    with torch.no_grad():
        logits = model(corrupted)
    handle.remove()
    return logits


def test_a_patch_sweep_over_heads_gives_each_heads_effect(model):
    clean, corrupted = _ids("wordplay"), _ids("workplay")
    result = sweep(model, clean, corrupted, over="heads")
    assert result.values.shape == (LAYERS, H)
    assert result.rows == [f"layers.{i}.mix.attend" for i in range(LAYERS)]
    assert torch.isfinite(result.values).all()
    with torch.no_grad():
        right = int(model(clean)[0, -1].argmax())
        wrong = next(
            t for t in model(corrupted)[0, -1].argsort(descending=True).tolist() if t != right
        )
    for layer, head in [(0, 2), (1, 0)]:
        logits = _patched_run(model, clean, corrupted, layer, head)[0, -1]
        want = float(logits[right] - logits[wrong])
        assert result.values[layer, head].item() == pytest.approx(want, abs=1e-5)
    assert len(set(result.values.flatten().tolist())) > 1  # heads differ


def test_the_patch_command_sweeps_a_file_models_einsum_heads(tmp_path):
    """``scratchformer patch --model FILE.py:EinsumLM``: this module's model, as a file."""
    from app.cli import main

    source = "import torch\nfrom torch import nn\n\n"
    source += f"VOCAB, C, H, D, LAYERS = {VOCAB}, {C}, {H}, {D}, {LAYERS}\n\n"
    source += "\n\n".join(inspect.getsource(c) for c in (Attend, Mixer, Layer, EinsumLM))
    (tmp_path / "einsum_lm.py").write_text(source)
    csv = tmp_path / "heads.csv"
    args = ["patch", "--model", f"{tmp_path / 'einsum_lm.py'}:EinsumLM"]
    args += ["--clean", "wordplay", "--corrupted", "workplay", "-o", str(csv), "--quiet"]
    assert main(args) == 0
    lines = csv.read_text().splitlines()
    assert lines[0] == "heads," + ",".join(f"head {h}" for h in range(H))
    assert [line.split(",")[0] for line in lines[1:]] == [
        f"layers.{i}.mix.attend" for i in range(LAYERS)
    ]
    assert all(cell for line in lines[1:] for cell in line.split(",")[1:])  # every head ran


def test_without_ops_the_weights_a_module_returns_are_maps_by_their_values(demo_model):
    """``ops=False`` records no softmax and no contraction: a module's second output is a
    map when each of its rows is a distribution (our ``ScaledDotProductAttention`` returns
    its weights so), and a state returned there instead is not."""
    ids = torch.tensor([list(b"wordplay")])
    full = tracing.trace(demo_model, ids, capture="shapes").attention_maps()
    bare = tracing.trace(demo_model, ids, capture="shapes", ops=False).attention_maps()
    assert list(bare) == list(full) and len(full) == 2
    for a, b in zip(full.values(), bare.values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    class State(nn.Module):
        def forward(self, x):  # (B, H, T, D): returns a K^T V state where weights would be
            return x, x.transpose(-1, -2) @ x

    t = tracing.trace(State(), torch.randn(1, 2, 5, 3), ops=False)
    assert t.attention_maps() == {}
