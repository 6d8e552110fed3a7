"""Axis names on models from outside ``transformers``, written out axis by axis (issue 31,
item 7; the survey is ``benchmarks/bench_dims_outside.py``).

Each model is written here the way people write it, traced with ``tracing.trace`` at sizes
that all differ and again with two sizes made equal: a name says what an axis is, so it
must be the same in both traces, and it must never be a letter of another concept (an
image's colour channels are not ``T``). Where the spelling of a name is the namer's choice
(a patch axis, an LSTM's hidden width) the tests ask for that, not for one spelling.

Tests marked ``xfail(strict=True)`` fail on the namer of today for the reason given; they
flip (and then fail as XPASS) when the rewrite makes them true: remove the mark then.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn

import tracing
from tracing.analysis.attention_maps import attention_map_records

pytestmark = pytest.mark.usefixtures("one_thread")

OTHER_CONCEPTS = {"B", "T", "C", "H", "KV", "D", "F", "V", "N"}


def output(trace, module: str, op: str, n: int = 0):
    """The first output record of the ``n``-th ``op`` step run directly in ``module``."""
    steps = [s for s in trace.steps if s.kind == "op" and s.module == module and s.op == op]
    return trace.tensor(steps[n].outputs[0])


def param(trace, module: str, n: int = 0):
    """The ``n``-th parameter record a step of ``module`` read (its weight, then bias)."""
    ids = dict.fromkeys(
        i
        for s in trace.steps
        if s.module == module
        for i in s.inputs
        if trace.tensor(i).role == "param"
    )
    return trace.tensor(list(ids)[n])


def letters(name: str) -> set[str]:
    return set(re.findall(r"[A-Za-z][A-Za-z0-9_]*", name))


def issue(reason: str):
    return pytest.mark.xfail(strict=True, reason=f"issue 31: {reason}")


# --------------------------------------------------------------------------- a ViT


class PatchEmbed(nn.Module):
    def __init__(self, patch_size, in_chans, embed_dim):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """timm's: one fused q/k/v projection, heads declared as attributes."""

    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = (q @ k.transpose(-2, -1) * self.head_dim**-0.5).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_dim):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, image_size, patch_size, embed_dim, num_heads, mlp_dim=120, classes=11):
        super().__init__()
        self.patch_embed = PatchEmbed(patch_size, 3, embed_dim)
        patches = (image_size // patch_size) ** 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.randn(1, patches + 1, embed_dim) * 0.02)
        self.blocks = nn.ModuleList(Block(embed_dim, num_heads, mlp_dim) for _ in range(2))
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, classes)

    def forward(self, img):
        x = self.patch_embed(img)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def trace_vit(batch, image_size, patch_size, embed_dim, num_heads=6):
    torch.manual_seed(0)
    model = ViT(image_size, patch_size, embed_dim, num_heads).eval()
    image = torch.randn(batch, 3, image_size, image_size)
    return tracing.trace(model, image, capture="shapes")


@pytest.fixture(scope="module")
def vit():
    """The same ViT three times: every size distinct (49 patches, 50 tokens, head width 10,
    patch 4); the issue's sizes (16 patches == head width 16, patch 8 == half of it); and a
    batch of 3, as many images as colour channels."""
    return {
        "distinct": trace_vit(2, 28, 4, 60),
        "patches == D": trace_vit(2, 32, 8, 96),
        "B == channels": trace_vit(3, 28, 4, 60),
    }


def test_vit_batch_widths_and_head_width(vit):
    """This ViT declares its heads and head width (``num_heads``, ``head_dim``) and nothing
    else: its width is ``H·D`` where the heads merge back, and its residual stream, which
    no op joins to that merge (the out-projection's rows are its own), reads ``?``."""
    for trace in vit.values():
        assert output(trace, "patch_embed.proj", "conv2d").dims[:2] == ("B", "?")
        split = output(trace, "blocks.0.attn", "reshape").dims
        assert (split[0], split[2], split[3], split[4]) == ("B", "3", "H", "D")
        merged = output(trace, "blocks.0.attn", "reshape", 1).dims
        assert (merged[0], merged[2]) == ("B", "C")  # C = H·D, the letters' own definition
        proj = param(trace, "blocks.0.attn.proj").dims
        assert proj[1] == "C"  # contracted with the merged heads
        assert output(trace, "blocks.1", "add", 1).dims[::2] == ("B", "?")


def test_vit_image_channels_are_never_a_position_letter(vit):
    names = {key: trace.tensor(0).dims for key, trace in vit.items()}
    channels = {dims[1] for dims in names.values()}
    assert len(channels) == 1  # the same at every size
    assert not letters(channels.pop()) & OTHER_CONCEPTS  # `?`, `3` or a proven name


def test_vit_patch_axis_keeps_its_name_when_patches_equal_head_width(vit):
    distinct = output(vit["distinct"], "patch_embed", "transpose").dims[1]
    same = output(vit["patches == D"], "patch_embed", "transpose").dims[1]
    assert distinct == same != "?"
    assert not letters(distinct) & (OTHER_CONCEPTS - {"T", "N"})  # not D, C, H, B...


def test_vit_token_axis_is_named_through_every_block(vit):
    """The tokens (patches + the class token) are what its attention attends over: ``Tk``,
    from the softmax over them, through every block; the patches are ``Tk-1``."""
    tokens = {}
    for key, trace in vit.items():
        patches = output(trace, "patch_embed", "transpose").dims[1]
        tok = output(trace, "", "cat").dims[1]
        assert (tok, patches) == ("Tk", "Tk-1")
        assert not letters(tok) & (OTHER_CONCEPTS - {"T", "N"})
        for block in ("blocks.0", "blocks.1"):
            assert output(trace, block, "add").dims[:2] == ("B", tok)  # width: see above
            assert output(trace, f"{block}.mlp.0", "linear").dims[:2] == ("B", tok)
            attn = output(trace, f"{block}.attn", "softmax").dims
            assert (attn[0], attn[2], attn[3]) == ("B", tok, tok)
        tokens[key] = tok
    assert len(set(tokens.values())) == 1


def test_vit_attention_maps_are_found_at_every_size(vit):
    for trace in vit.values():
        maps = trace.attention_maps()
        assert list(maps) == ["blocks.0.attn", "blocks.1.attn"]
        patches = trace.tensor(0).shape[-1] // trace.tensor(1).shape[-1]  # image / kernel
        assert tuple(maps["blocks.0.attn"].shape[2:]) == (patches**2 + 1,) * 2


def test_vit_heads_read_H(vit):
    for trace in vit.values():
        assert output(trace, "blocks.0.attn", "reshape").dims[3] == "H"
        assert output(trace, "blocks.0.attn", "softmax").dims[:2] == ("B", "H")


def test_vit_patch_kernel_is_not_half_a_head(vit):
    """An 8×8 kernel beside a head width of 16 is not ``D/2, D/2``: nothing this ViT declares
    sizes its kernel (nor its rows, the width: ``C`` with its constructor, in
    ``test_constructor.py``), so every size reads it the same, unnamed."""
    kernels = set()
    for trace in vit.values():
        weight = param(trace, "patch_embed.proj").dims or ("?",) * 4  # (C, channels, p, p)
        assert weight[2] == weight[3]
        assert not letters(weight[2]) & OTHER_CONCEPTS
        kernels.add(weight)
    assert kernels == {("?", "?", "?", "?")}


def test_vit_batch_reads_b_when_it_equals_the_channels_and_qkv(vit):
    trace = vit["B == channels"]
    assert trace.tensor(0).dims[0] == "B"
    for block in ("blocks.0", "blocks.1"):
        assert output(trace, f"{block}.attn", "permute").dims[:2] == ("3", "B")
        unbind = next(s for s in trace.steps if s.module == f"{block}.attn" and s.op == "unbind")
        assert [trace.tensor(o).dims[0] for o in unbind.outputs] == ["B"] * 3  # q, k, v
        assert output(trace, f"{block}.attn", "softmax").dims[0] == "B"
        assert output(trace, block, "add", 1).dims[0] == "B"
    assert output(trace, "head", "linear").dims[0] == "B"


# --------------------------------------------------------------------------- an LSTM LM


class RecurrentLM(nn.Module):
    def __init__(self, vocab_size, embed_dim, hidden_size, num_layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.rnn = nn.LSTM(embed_dim, hidden_size, num_layers, batch_first=True)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, ids):
        x = self.embed(ids)  # (B, T, E)
        out, _ = self.rnn(x)  # (B, T, Hd)
        return self.head(out)  # (B, T, V)


def trace_lstm(batch=3, vocab=50, embed=24, hidden=40):
    torch.manual_seed(0)
    ids = torch.randint(0, vocab, (batch, 11))
    return tracing.trace(RecurrentLM(vocab, embed, hidden).eval(), ids, capture="shapes")


def lstm_names(trace):
    """(embedding output, LSTM output, final hidden state, head weight, logits) dims."""
    return (
        output(trace, "embed", "embedding").dims,
        output(trace, "rnn", "lstm").dims,
        trace.tensor(next(s for s in trace.steps if s.op == "lstm").outputs[1]).dims,
        param(trace, "head").dims,
        output(trace, "head", "linear").dims,
    )


def test_lstm_lm_hidden_axis_and_logits():
    _, out, state, weight, logits = lstm_names(trace_lstm())
    hidden = out[2]
    assert out[:2] == ("B", "T")
    assert hidden != "?" and not letters(hidden) & {"D", "H", "F", "V", "KV"}  # no heads
    assert logits == ("B", "T", "V")
    assert weight == ("V", hidden)
    assert state[1:] == ("B", hidden)


def test_lstm_lm_layers_axis_is_not_the_batch_when_they_are_equal():
    _, _, state, _, _ = lstm_names(trace_lstm(batch=2))  # 2 layers, a batch of 2
    assert state[1] == "B" and state[0] != "B"


def test_lstm_lm_hidden_and_logits_when_vocab_equals_hidden():
    _, out, _, _, _ = lstm_names(trace_lstm())
    hidden = out[2]
    _, out, state, weight, logits = lstm_names(trace_lstm(vocab=40))
    assert out == ("B", "T", hidden)
    assert state[1:] == ("B", hidden)
    assert logits == ("B", "T", "V")
    assert weight == ("V", hidden)


def test_lstm_input_weight_is_not_named_by_a_hidden_width_it_equals():
    """``nn.LSTM`` declares ``input_size`` and ``hidden_size``: at 40 == 40 its documented
    shapes still say which axis is which, so the input weight's columns are not ``C``."""
    distinct = param(trace_lstm(), "rnn").dims  # weight_ih_l0: (4·hidden, input)
    same = param(trace_lstm(embed=40), "rnn").dims
    assert distinct is None or distinct[1] == "?"  # no letter declares the input width
    assert same is None or same[1] == "?"
    for embed in (24, 40):  # weight_hh_l0: (4 gates · hidden_size, hidden_size)
        assert param(trace_lstm(embed=embed), "rnn", 1).dims == ("4C", "C")


@issue("the embedding width reads ? at every size: no letter declares it (a rebuild names it)")
def test_lstm_lm_embedding_width_keeps_its_name_when_it_equals_the_hidden():
    distinct = lstm_names(trace_lstm())[0]
    same = lstm_names(trace_lstm(embed=40))[0]
    assert distinct == same
    assert distinct[2] != "?"


# --------------------------------------------------------------------------- einsum attention


class EinsumAttention(nn.Module):
    """lucidrains-style: ``heads`` × ``dim_head`` wide, scores and mixing by einsum."""

    def __init__(self, dim, heads, dim_head):
        super().__init__()
        self.heads = heads
        self.scale = dim_head**-0.5
        self.to_qkv = nn.Linear(dim, 3 * heads * dim_head, bias=False)
        self.to_out = nn.Linear(heads * dim_head, dim)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (y.view(b, t, self.heads, -1).transpose(1, 2) for y in (q, k, v))
        sim = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attn = sim.masked_fill(causal, float("-inf")).softmax(dim=-1)
        out = torch.einsum("bhij,bhjd->bhid", attn, v)
        return self.to_out(out.transpose(1, 2).reshape(b, t, -1))


class EinsumLM(nn.Module):
    def __init__(self, vocab_size=101, dim=96, heads=6, dim_head=20):
        super().__init__()
        self.token_emb = nn.Embedding(vocab_size, dim)
        self.attn = EinsumAttention(dim, heads, dim_head)
        self.to_logits = nn.Linear(dim, vocab_size)

    def forward(self, ids):
        x = self.token_emb(ids)
        return self.to_logits(x + self.attn(x))


def trace_einsum(tokens=11, **sizes):
    torch.manual_seed(0)
    ids = torch.randint(0, 101, (3, tokens))
    return tracing.trace(EinsumLM(**sizes).eval(), ids, capture="shapes")


def test_einsum_attention_head_width_is_what_its_scores_contract():
    """It keeps ``heads`` and a scale, not ``dim_head``: ``C / H`` (96 / 6 = 16) would be a
    size that proves nothing. The width the scores' einsum contracts q and k over is the
    head width (20), at any sizes, also where it equals C / H (16 == 96 / 6)."""
    for dim_head in (20, 16):
        trace = trace_einsum(dim_head=dim_head)
        scores = next(s for s in trace.steps if s.op == "einsum")
        q, k = (trace.tensor(i) for i in scores.inputs)
        assert q.dims == k.dims == ("B", "H", "T", "D")
        assert q.why[3].startswith("contracted #")
        assert trace.meta["dims"]["D"] == dim_head
        mixed = output(trace, "attn", "einsum", 1)  # the values': their own proof, below
        assert mixed.dims[:3] == ("B", "H", "T")


def test_a_fused_projection_cut_in_three_gives_the_values_the_queries_width():
    """``to_qkv(x).chunk(3, dim=-1)``: the three parts are one size by the op, so where the
    queries' width is proven ``H·D`` (their view into heads of the contracted width), the
    keys' and the values' is ``H·D`` too, the fused rows ``3H·D``, and the values' head
    width ``D`` — also where ``H·D`` equals the model width (``C``: a size, not a proof)."""
    for dim_head in (20, 16):  # 6 x 16 == 96 == C
        trace = trace_einsum(dim_head=dim_head)
        fused = output(trace, "attn.to_qkv", "linear")
        parts = [trace.tensor(i) for i in next(s for s in trace.steps if s.op == "chunk").outputs]
        assert fused.dims == ("B", "T", "3H·D") and fused.why[2] == "sum chunk"
        assert [p.dims for p in parts] == [("B", "T", "H·D")] * 3
        mixed = output(trace, "attn", "einsum", 1)
        assert mixed.dims == ("B", "H", "T", "D")
        assert param(trace, "attn.to_qkv").dims == ("3H·D", "C")
        assert param(trace, "attn.to_out").dims == ("C", "H·D")


def test_einsum_attention_map_is_found_with_its_batch_and_tokens():
    trace = trace_einsum()
    scores = output(trace, "attn", "einsum").dims
    weights = output(trace, "attn", "softmax")
    mixed = output(trace, "attn", "einsum", 1).dims
    assert (scores[0], *scores[2:]) == ("B", "T", "T")
    assert weights.shape == (3, 6, 11, 11)
    assert (weights.dims[0], *weights.dims[2:]) == ("B", "T", "T")
    assert (mixed[0], mixed[2]) == ("B", "T")
    maps = trace.attention_maps()
    assert list(maps) == ["attn"] and tuple(maps["attn"].shape) == (3, 6, 11, 11)


def test_einsum_attention_names_are_the_same_when_tokens_equal_head_width():
    distinct, same = trace_einsum(), trace_einsum(tokens=20)  # T == dim_head
    assert [r.dims for r in distinct.tensors] == [r.dims for r in same.tensors]


def test_einsum_attention_map_reads_b_h_t_t():
    trace = trace_einsum()
    assert output(trace, "attn", "einsum").dims == ("B", "H", "T", "T")
    assert output(trace, "attn", "softmax").dims == ("B", "H", "T", "T")
    assert output(trace, "attn", "einsum", 1).dims[:3] == ("B", "H", "T")


# --------------------------------------------------------------------------- released sizes


def trace_llama(device: str, **sizes):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        num_hidden_layers=1, rope_theta=500000.0, attn_implementation="eager", **sizes
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).eval()
        ids = torch.randint(0, sizes["vocab_size"], (3, 11))
    return tracing.trace(model, ids, capture="shapes")


def test_llama_3_70b_sizes_are_named_as_a_small_llama():
    released = trace_llama(  # the real model's config.json, one layer, on meta
        "meta", hidden_size=8192, intermediate_size=28672, num_attention_heads=64,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
    )  # fmt: skip
    small = trace_llama(
        "cpu", hidden_size=96, intermediate_size=200, num_attention_heads=6,
        num_key_value_heads=2, head_dim=16, vocab_size=101, max_position_embeddings=76,
    )  # fmt: skip
    assert output(small, "model.rotary_emb", "cos").dims == ("1", "T", "D")
    assert [r.dims for r in released.tensors] == [r.dims for r in small.tensors]


# --------------------------------------------------------------------------- tokens first


class SequenceFirstLM(nn.Module):
    """torch's own encoder layers in their default layout: ``(T, B, C)``, tokens first."""

    def __init__(self, vocab=50, width=32, heads=4, ff=64, batch_first=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, ff, dropout=0.0, batch_first=batch_first)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)
        self.tokens_axis = 1 if batch_first else 0

    def forward(self, ids):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[self.tokens_axis])
        return self.head(self.enc(self.emb(ids), mask=mask, is_causal=True))


@pytest.mark.parametrize("batch_first", [False, True])
def test_a_tokens_first_input_reads_t_b_as_its_attention_shows(batch_first):
    """B and T are not the first input's axes 0 and 1 by position: torch's default
    ``(T, B)`` layout is read from what its attention attends over (the tokens)."""
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (3, 11) if batch_first else (11, 3))  # 3 sequences of 11
    trace = tracing.trace(SequenceFirstLM(batch_first=batch_first).eval(), ids, capture="shapes")
    layout = ("B", "T") if batch_first else ("T", "B")
    assert trace.tensor(0).dims == layout
    assert output(trace, "emb", "embedding").dims == (*layout, "C")
    maps = trace.attention_maps()
    assert list(maps) == ["enc.layers.0.self_attn", "enc.layers.1.self_attn"]
    for module, rid in attention_map_records(trace).items():
        assert tuple(maps[module].shape) == (3, 4, 11, 11)
        assert trace.tensor(rid).dims == ("B", "H", "T", "T")
    assert (trace.meta["dims"]["B"], trace.meta["dims"]["T"]) == (3, 11)
    assert output(trace, "head", "linear").dims[:2] == layout


class PatchesOnTorchAttention(nn.Module):
    """Patches and a class token through one ``nn.MultiheadAttention``: its fused op joins
    its output to its query, and its map's rows and columns to the query's and key's tokens."""

    def __init__(self, patch=4, width=60, heads=6):
        super().__init__()
        self.proj = nn.Conv2d(3, width, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)

    def forward(self, img):
        x = self.proj(img).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), dim=1)
        return x + self.attn(x, x, x, need_weights=False)[0]


def test_torch_attention_carries_the_tokens_it_attends_over_to_its_output():
    torch.manual_seed(0)
    trace = tracing.trace(PatchesOnTorchAttention().eval(), torch.randn(2, 3, 28, 28))
    (rid,) = attention_map_records(trace).values()
    assert trace.tensor(rid).dims == ("B", "H", "Tk", "Tk")
    assert output(trace, "", "cat").dims == ("B", "Tk", "C")  # C: the module's embed_dim
    assert output(trace, "", "add").dims == ("B", "Tk", "C")
    assert output(trace, "", "transpose").dims[1] == "Tk-1"  # the 49 patches
