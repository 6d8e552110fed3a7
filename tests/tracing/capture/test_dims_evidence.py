"""Dims from evidence on the models people bring: each architecture's attention and MLP
steps named axis by axis (written out here), the same names when two sizes coincide,
and every letter's size and origin kept in the trace and its file."""

from __future__ import annotations

import pytest
import torch
from helpers.dims_models import build
from torch import nn

import tracing
from tracing.dims import passes as dim_evidence
from tracing.dims.letters import size_of
from tracing.dims.passes import other_sizes

pytestmark = pytest.mark.usefixtures("one_thread")


def ops(trace, suffix: str, wanted: set[str]) -> list[tuple[str, str]]:
    """``(op, "(B,T,C) ...")`` for the wanted ops of the first call of a module path ending so."""
    first = next(s for s in trace.steps if s.kind == "module" and s.module.endswith(suffix))
    out = []
    for s in trace.steps[first.index : first.end + 1]:
        if s.kind == "op" and s.op in wanted and s.outputs:  # its ops and its children's
            dims = " ".join("(" + ",".join(trace.tensor(i).dims or ()) + ")" for i in s.outputs)
            out.append((s.op, dims))
    return out


def named_share(trace) -> float:
    axes = [
        d for r in trace.tensors if len(r.shape) >= 2 for d in (r.dims or ("?",) * len(r.shape))
    ]
    return sum(d != "?" for d in axes) / len(axes)


PROJ = {"linear", "view", "transpose", "reshape", "matmul", "softmax"}

EXPECTED = {
    "llama": {  # GQA: 6 query heads, 2 key/value heads; head_dim given apart from C, so
        # the knob passes tell H·D (q_proj's width, o_proj's input) from C
        "self_attn": [
            ("linear", "(B,T,H·D)"),
            ("view", "(B,T,H,D)"),
            ("transpose", "(B,H,T,D)"),
            ("linear", "(B,T,KV·D)"),
            ("view", "(B,T,KV,D)"),
            ("transpose", "(B,KV,T,D)"),
            ("linear", "(B,T,KV·D)"),
            ("view", "(B,T,KV,D)"),
            ("transpose", "(B,KV,T,D)"),
            ("reshape", "(B,H,T,D)"),
            ("reshape", "(B,H,T,D)"),
            ("transpose", "(B,H,D,T)"),
            ("matmul", "(B,H,T,T)"),
            ("softmax", "(B,H,T,T)"),
            ("matmul", "(B,H,T,D)"),
            ("transpose", "(B,T,H,D)"),
            ("reshape", "(B,T,H·D)"),
            ("linear", "(B,T,C)"),
        ],
        "mlp": [("linear", "(B,T,F)"), ("linear", "(B,T,F)"), ("linear", "(B,T,C)")],
    },
    "qwen2": {  # one key/value head: its axis reads 1 (see tracing/capture/dim_letters.py)
        "self_attn": [
            ("linear", "(B,T,C)"),
            ("view", "(B,T,H,D)"),
            ("transpose", "(B,H,T,D)"),
            ("linear", "(B,T,D)"),  # k: KV·D with KV = 1 is D
            ("view", "(B,T,1,D)"),
            ("transpose", "(B,1,T,D)"),
            ("getitem", "(B,H,T,D/2)"),  # rotate_half
            ("cat", "(B,H,T,D)"),
            ("getitem", "(B,1,1,T,D)"),  # repeat_kv's [:, :, None]
            ("reshape", "(B,H,T,D)"),
            ("transpose", "(B,H,D,T)"),
            ("matmul", "(B,H,T,T)"),
            ("softmax", "(B,H,T,T)"),
            ("matmul", "(B,H,T,D)"),
            ("transpose", "(B,T,H,D)"),
            ("reshape", "(B,T,C)"),
            ("linear", "(B,T,C)"),
        ],
        "mlp": [("linear", "(B,T,F)"), ("linear", "(B,T,F)"), ("linear", "(B,T,C)")],
    },
    "gpt_neox": {  # rotary_pct=0.25: a rotary width R = D/4 of each head
        "attention": [
            ("linear", "(B,T,3C)"),
            ("view", "(B,T,H,3D)"),
            ("transpose", "(B,H,T,3D)"),
            ("chunk", "(B,H,T,D) (B,H,T,D) (B,H,T,D)"),
            ("getitem", "(B,H,T,R)"),
            ("getitem", "(B,H,T,D-R)"),
            ("cat", "(B,H,T,D)"),
        ],
        "mlp": [("linear", "(B,T,F)"), ("linear", "(B,T,C)")],
    },
    "mixtral": {  # 5 experts, top-2
        "mlp": [("view", "(B·T,C)"), ("reshape", "(B,T,C)")],
        "mlp.gate": [("linear", "(B·T,E)"), ("softmax", "(B·T,E)"), ("topk", "(B·T,K) (B·T,K)")],
        "mlp.experts": [("chunk", "(B·T·K,F) (B·T·K,F)"), ("view", "(B·T,K,C)")],
    },
    "gpt2": {
        "attn": [
            ("split", "(B,T,C) (B,T,C) (B,T,C)"),
            ("view", "(B,T,H,D)"),
            ("transpose", "(B,H,T,D)"),
            ("matmul", "(B,H,T,T)"),
            ("softmax", "(B,H,T,T)"),
            ("matmul", "(B,H,T,D)"),
        ],
    },
    "falcon": {  # new decoder architecture: one fused (H+2KV)·D projection
        "self_attention": [
            ("matmul", "(B,T,(H+2KV)·D)"),
            ("view", "(B,T,KV,H/KV+2,D)"),
            ("getitem", "(B,T,KV,H/KV,D)"),
            ("getitem", "(B,T,KV,D)"),  # grouped[..., -2, :] (transformers 5)
        ],
        "mlp": [("matmul", "(B,T,F)"), ("matmul", "(B,T,C)")],
    },
    "phi3": {
        "self_attn": [("linear", "(B,T,(H+2KV)·D)"), ("view", "(B,T,H,D)")],
        "mlp": [("linear", "(B,T,2F)"), ("chunk", "(B,T,F) (B,T,F)"), ("linear", "(B,T,C)")],
    },
    "gemma2": {
        "self_attn": [("linear", "(B,T,C)"), ("linear", "(B,T,KV·D)"), ("softmax", "(B,H,T,T)")],
        "mlp": [("linear", "(B,T,F)"), ("linear", "(B,T,C)")],
    },
    "deepseek_v3": {  # multi-head latent attention (its rotary width is its D), routed experts
        "self_attn.q_a_proj": [("linear", "(B,T,Lq)")],
        "self_attn.q_b_proj": [("linear", "(B,T,H·(Dn+D))")],
        "self_attn.kv_a_proj_with_mqa": [("linear", "(B,T,Lkv+D)")],
        "self_attn": [
            ("view", "(B,T,H,Dn+D)"),
            ("split", "(B,H,T,Dn) (B,H,T,D)"),
            ("split", "(B,T,Lkv) (B,T,D)"),
            ("view", "(B,T,H,Dn+Dv)"),
            ("split", "(B,H,T,Dn) (B,H,T,Dv)"),
            ("matmul", "(B,H,T,T)"),
        ],
        "mlp.gate": [("linear", "(B·T,E)")],
    },
}
_WANT = PROJ | {"chunk", "getitem", "cat", "split", "topk"}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_attention_and_mlp_steps_read_in_full(kind):
    model, ids = build(kind)
    trace = tracing.trace(model, ids, capture="shapes")
    for suffix, expected in EXPECTED[kind].items():
        layer = "h.0." if kind in ("gpt2", "falcon") else "layers.0."
        got = ops(trace, layer + suffix, _WANT)
        for step in expected:
            assert step in got, (suffix, step, got)
    assert named_share(trace) >= 0.98


# --------------------------------------------------------------------------- coincidences


def same_names(a, b) -> list:
    """Axes whose names differ between two traces of the same steps (tensor by tensor)."""
    assert [(s.module, s.op) for s in a.steps] == [(s.module, s.op) for s in b.steps]
    return [
        (ra.shape, ra.dims, rb.shape, rb.dims)
        for ra, rb in zip(a.tensors, b.tensors)
        if ra.dims != rb.dims
    ]


@pytest.mark.parametrize(("b", "t"), [(3, 16), (11, 11)])  # T == D; B == T
def test_llama_names_do_not_change_when_input_sizes_coincide(b, t):
    model, _ = build("llama")
    distinct = tracing.trace(model, torch.randint(0, 101, (3, 11)), capture="shapes")
    same = tracing.trace(model, torch.randint(0, 101, (b, t)), capture="shapes")
    assert same_names(distinct, same) == []


def test_rotary_width_equal_to_heads_keeps_both_letters():
    """GPT-NeoX, rotary_pct=0.25 of D=16: R=4, against H=6 and then H=4."""
    distinct = tracing.trace(*build("gpt_neox"), capture="shapes")
    c64 = dict.fromkeys(("hidden_size", "d_model", "n_embd", "embed_dim"), 64)
    model, ids = build("gpt_neox", num_attention_heads=4, max_position_embeddings=80, **c64)
    same = tracing.trace(model, ids, capture="shapes")
    assert same.meta["dim_letters"]["R"]["size"] == same.meta["dim_letters"]["H"]["size"] == 4
    assert same_names(distinct, same) == []


def test_experts_equal_to_heads_keep_their_letter():
    distinct = tracing.trace(*build("mixtral"), capture="shapes")
    model, ids = build("mixtral", num_local_experts=6)
    same = tracing.trace(model, ids, capture="shapes")
    assert same.meta["dim_letters"]["E"]["size"] == same.meta["dim_letters"]["H"]["size"] == 6
    assert same_names(distinct, same) == []


def test_top_k_equal_to_query_heads_per_key_value_head_keeps_both_names():
    """Mixtral, H=6 over KV=2 (H/KV = 3): top-3 routing against top-4. The attention's
    grouped axis stays H/KV (the words of ``self_attn`` point at heads, not experts), the
    router's stays K."""
    distinct = tracing.trace(*build("mixtral", num_experts_per_tok=4), capture="shapes")
    same = tracing.trace(*build("mixtral", num_experts_per_tok=3), capture="shapes")
    assert same.meta["dim_letters"]["K"]["size"] == 3
    assert same_names(distinct, same) == []
    grouped = [r.dims for r in same.tensors if r.dims and "H/KV" in r.dims]
    assert ("B", "KV", "H/KV", "T", "D") in grouped
    assert any(r.dims == ("B·T", "K") for r in same.tensors)


def test_bert_output_projection_reads_f_where_the_vocabulary_is_as_wide():
    """BERT as a causal LM, F == V == 200: its ``output.dense`` weight has no word that says
    feed-forward, but its input axis contracts with the ``intermediate`` activation (F)."""
    import transformers as tf
    from helpers.dims_models import from_config

    sizes = dict(hidden_size=96, num_attention_heads=6, num_hidden_layers=1, is_decoder=True)
    distinct = tracing.trace(
        *from_config(tf.BertConfig, tf.BertLMHeadModel, intermediate_size=200, **sizes),
        capture="shapes",
    )
    same = tracing.trace(
        *from_config(
            tf.BertConfig, tf.BertLMHeadModel, intermediate_size=101, **sizes
        ),  # F == V == 101
        capture="shapes",
    )
    assert same.meta["dim_letters"]["F"]["size"] == same.meta["dim_letters"]["V"]["size"]
    assert same_names(distinct, same) == []
    weights = {
        s.module: same.tensors[s.inputs[1]].dims
        for s in same.steps
        if s.op == "linear" and s.module.endswith("output.dense")
    }
    assert ("C", "F") in weights.values()


class DecoderLM(nn.Module):
    """``nn.TransformerDecoder`` (batch first) between an embedding and an LM head."""

    def __init__(self, vocab=101, d_model=96, heads=6, d_ff=200):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerDecoderLayer(d_model, heads, d_ff, dropout=0.0, batch_first=True)
        self.decoder = nn.TransformerDecoder(layer, num_layers=1)
        self.lm_head = nn.Linear(d_model, vocab)

    def forward(self, ids):
        x = self.embed(ids)  # (B, T, C)
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.lm_head(self.decoder(x, x, tgt_mask=mask, tgt_is_causal=True))


def test_transformer_decoder_reads_f_not_v_when_they_are_equal():
    torch.manual_seed(0)
    ids = torch.randint(0, 101, (3, 11))
    distinct = tracing.trace(DecoderLM().eval(), ids, capture="shapes")
    same = tracing.trace(DecoderLM(d_ff=101).eval(), ids, capture="shapes")
    # at F == V nothing this model declares or any pass moves tells the two apart (it cannot
    # be rebuilt, and words are no proof): an axis either keeps its name or reads ?
    changed = same_names(distinct, same)
    assert all(
        b == "?" for _, da, _, db in changed for a, b in zip(da or (), db or ()) if a != b
    ), changed
    widths = ops(same, "decoder.layers.0.linear1", {"linear"})
    assert widths in ([("linear", "(B,T,F)")], [("linear", "(B,T,?)")])
    ffn = ops(distinct, "decoder.layers.0.linear1", {"linear"})
    assert ffn == [("linear", "(B,T,F)")]
    # the head's rows are the vocabulary's size, but no op joins them to the token table's
    # rows (its weight is its own) and no config declares V: the size alone is no proof
    assert distinct.tensor(distinct.steps[0].outputs[0]).dims == ("B", "T", "?")
    assert named_share(distinct) >= 0.9


# --------------------------------------------------------------------------- the record


def test_letters_sizes_and_origins_survive_a_save_and_load(tmp_path):
    from tracing import file as trace_file

    trace = tracing.trace(*build("llama"), capture="shapes")
    letters = trace.meta["dim_letters"]
    assert letters["KV"] == {
        "size": 2,
        "origin": "config.num_key_value_heads",
        "meaning": letters["KV"]["meaning"],
    }
    assert letters["B"]["origin"].startswith("input") and letters["T"]["size"] == 11
    assert trace.meta["dims_evidence"]["pass"] == "device"  # small: run for real
    path = trace_file.save(trace, tmp_path / "llama.sft")
    loaded = trace_file.load(path)
    assert [r.dims for r in loaded.tensors] == [r.dims for r in trace.tensors]
    assert loaded.meta["dim_letters"] == letters
    assert any("KV·D" in (r.dims or ()) for r in loaded.tensors)


def test_no_second_pass_keeps_what_the_ops_prove_and_says_so(monkeypatch):
    from tracing.dims import passes as dim_evidence

    monkeypatch.setattr(dim_evidence, "ENABLED", False)
    model, _ = build("llama")
    trace = tracing.trace(model, torch.randint(0, 101, (3, 16)), capture="shapes")  # T == D
    assert any("no second pass" in n for n in trace.meta["notes"])
    for r in trace.tensors:  # never a wrong letter: T only on axes of T's size...
        for name, size in zip(r.dims or (), r.shape):
            assert name == "?" or size_of(name, {**trace.meta["dims"], "KV": 2}) == size
    k = ops(trace, "layers.0.self_attn", {"transpose"})[1]
    assert k == ("transpose", "(B,KV,T,D)")  # ...and carried from the input, not guessed


def test_expressions_and_pass_sizes():
    assert size_of("B·T·K", {"B": 3, "T": 11, "K": 2}) == 66
    assert size_of("(H+2KV)·D", {"H": 6, "KV": 2, "D": 16}) == 160
    assert size_of("D-R", {"D": 16, "R": 4}) == 12 and size_of("T+P", {"T": 3}) is None
    b2, t2 = other_sizes(3, 11, {96, 6, 2, 16, 200, 101}, 64)
    assert b2 not in {3, 11, 96, 6, 2, 16, 200, 101} and t2 not in {3, 11, 96, 6, 2, 16, 200, 101}
    assert t2 <= 64


def test_the_second_pass_is_invisible_to_the_user_and_leaves_the_model_as_it_was():
    """The user's forward hooks see one call per forward, and a module registered under two
    names (a ModuleDict aliasing a Sequential) keeps its own weights after the pass."""
    from torch import nn

    class Aliased(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Sequential(nn.Linear(4, 6))
            self.outer = nn.ModuleDict({"gate": self.inner})

        def forward(self, x):
            return self.outer["gate"](x).softmax(-1)

    model = Aliased()
    weight = model.inner[0].weight
    calls = []
    model.inner.register_forward_hook(lambda m, a, out: calls.append(tuple(out.shape)))
    x = torch.randn(3, 5, 4)
    trace = tracing.trace(model, x, capture="shapes")
    assert trace.meta["dims_evidence"]["pass"] in ("meta", "device")  # the pass ran
    assert calls == [(3, 5, 6)]  # once, at the user's sizes
    assert model.inner[0].weight is weight and weight.device.type == "cpu"
    assert model.outer["gate"][0].weight is weight
    torch.testing.assert_close(model(x), torch.softmax(x @ weight.T + model.inner[0].bias, -1))


def test_the_second_pass_leaves_the_random_state_as_an_untraced_forward_does():
    from torch import nn

    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x) + torch.randn_like(x)  # draws from the global generator

    model, x = Noisy().eval(), torch.randn(2, 3, 4)
    torch.manual_seed(7)
    with torch.no_grad():
        model(x)
    after_plain = torch.rand(3)
    torch.manual_seed(7)
    trace = tracing.trace(model, x, capture="shapes")
    assert trace.meta["dims_evidence"]["pass"] in ("meta", "device")
    assert torch.equal(torch.rand(3), after_plain)


def test_the_pass_on_meta_and_the_pass_on_the_device_give_the_same_names(monkeypatch):
    """Two independent second passes: the model run for real at other sizes, and the same
    model with shape-only weights on the meta device."""
    on_device = tracing.trace(*build("llama"), capture="shapes")
    monkeypatch.setattr(dim_evidence, "SMALL_MODEL_BYTES", 0)
    on_meta = tracing.trace(*build("llama"), capture="shapes")
    assert (on_device.meta["dims_evidence"]["pass"], on_meta.meta["dims_evidence"]["pass"]) == (
        "device",
        "meta",
    )
    assert [r.dims for r in on_meta.tensors] == [r.dims for r in on_device.tensors]


def test_context_length_equal_to_the_width_names_the_width_not_the_table_rows():
    """examples/nanogpt_nan: block_size == n_embd == 32. The residual stream, the attention
    and the MLP outputs read (B, T, C); the position table's rows are never called C (its
    32 x 32 weight reads ? where nothing tells rows from columns)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "examples" / "nanogpt_nan" / "model.py"
    spec = importlib.util.spec_from_file_location("nanogpt_nan_model", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    model = module.GPT().eval()
    assert model.config.block_size == model.config.n_embd == 32
    trace = tracing.trace(model, torch.randint(0, 256, (4, 32)), capture="shapes")
    out = {s.module: trace.tensor(s.outputs[0]).dims for s in trace.steps if s.kind == "module"}
    assert out["transformer.wpe"] == ("T", "C")
    for path in ("transformer.h.0.attn", "transformer.h.0.mlp", "transformer.h.1"):
        assert out[path] == ("B", "T", "C"), path
    table = next(r for r in trace.tensors if r.role == "param" and r.shape == (32, 32))
    assert table.dims is None or "C" not in table.dims[:1]


def test_rotary_halves_read_d_over_2_when_they_are_as_wide_as_the_heads():
    """A Llama with head_dim 8 and 4 heads: the halves rotate_half cuts are D/2 (4), the
    size of H too; the cut, not the size, names them, and the cat puts D back."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    trace = tracing.trace(model, torch.randint(0, 97, (3, 11)), capture="shapes")
    attention = [s for s in trace.steps if s.module == "model.layers.0.self_attn"]
    halves = [trace.tensor(s.outputs[0]).dims for s in attention if s.op in ("getitem", "neg")]
    assert halves and {d[-1] for d in halves} == {"D/2"}, halves
    cats = [trace.tensor(s.outputs[0]).dims for s in attention if s.op == "cat"]
    assert ("B", "H", "T", "D") in cats and ("B", "KV", "T", "D") in cats
