"""Head edits addressed to the attention module, on every attention the tracer recognises.

``Edit(<attention module>, Zero(), head=h)`` finds the head's output inside the module from
what the trace recorded; the reference is independent of the tracer: a copy of the model
whose output projection has head h's input columns zeroed (``W_o``, ``o_proj``,
``c_proj``, ``out_proj``; HF GPT-2's ``Conv1D`` is ``x @ W``, so there its *rows*).
"""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass

import pytest
import torch
from helpers.own_models import NANOGPT, TUTORIAL_FIXED
from helpers.tiny_models import tiny_gpt2, tiny_model
from torch import nn

import tracing
from tracing.capture.edits import Edit, EditError, Zero
from tracing.runs.edit_run import run_edited
from tracing.runs.patching import output_logits, sweep

transformers = pytest.importorskip("transformers")


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Decoder(nn.Module):
    """A decoder-only LM on ``nn.TransformerDecoder`` (self- and cross-attention, both
    ``nn.MultiheadAttention``), the memory being its own embeddings."""

    def __init__(self, vocab=40, E=24, H=4, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, E)
        layer = nn.TransformerDecoderLayer(E, H, 48, dropout=0.0, batch_first=True)
        self.dec = nn.TransformerDecoder(layer, layers)
        self.head = nn.Linear(E, vocab)

    def forward(self, ids):
        h = self.emb(ids)
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
        return self.head(self.dec(h, h, tgt_mask=mask))


@dataclass
class Kind:
    """One kind of attention: how to build it, where its attention module is, how to zero
    head ``h`` of layer ``l`` by weight surgery, and the site the edit must resolve to."""

    build: object  # () -> model (eval, seeded)
    vocab: int
    heads: int
    attention: str  # path of layer {l}'s attention module
    resolved: str  # the per-head site it resolves to ("" for nn.MultiheadAttention)
    surgery: object  # (model, layer, head) -> None, in place
    kv_heads: int = 0  # grouped-query attention: key/value heads
    extra: str = ""  # a second attention per layer (a decoder's cross-attention)

    def rows(self) -> list[str]:
        """The attention modules a sweep over heads has a row for, in the order they run."""
        names = [self.attention, self.extra] if self.extra else [self.attention]
        return [name.format(layer) for layer in range(2) for name in names]


def _linear_columns(path: str, D: int):
    def surgery(model, layer, head):
        weight = model.get_submodule(path.format(layer)).weight
        weight[:, head * D : (head + 1) * D] = 0  # nn.Linear: y = x @ W.T, inputs are columns

    return surgery


def _conv1d_rows(path: str, D: int):
    def surgery(model, layer, head):
        weight = model.get_submodule(path.format(layer)).weight
        weight[head * D : (head + 1) * D] = 0  # Conv1D: y = x @ W, inputs are rows

    return surgery


def _tutorial():
    torch.manual_seed(0)
    return (
        _module(TUTORIAL_FIXED, "tutorial_heads")
        .TutorialLM(vocab_size=60, d_model=32, num_heads=4, d_ff=64, num_layers=2)
        .eval()
    )


def _nanogpt():
    torch.manual_seed(0)
    return _module(NANOGPT, "nanogpt_heads").GPT(vocab_size=60, n_layer=2, n_head=4).eval()


def _llama(impl):
    def build():
        torch.manual_seed(0)
        config = transformers.LlamaConfig(
            vocab_size=60, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=32,
            attn_implementation=impl,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config).eval()

    return build


def _decoder():
    torch.manual_seed(0)
    return Decoder().eval()


KINDS = {
    "scratchformer": Kind(
        lambda: tiny_model(seed=0), 50, 4, "blocks.{}.self_attn",
        "blocks.{}.self_attn.attention", _linear_columns("blocks.{}.self_attn.W_o", 8),
    ),
    "tutorial": Kind(
        _tutorial, 60, 4, "blocks.{}.self_attn", "blocks.{}.self_attn:matmul#1",
        _linear_columns("blocks.{}.self_attn.W_o", 8),
    ),
    "nanogpt-sdpa": Kind(
        _nanogpt, 60, 4, "transformer.h.{}.attn",
        "transformer.h.{}.attn:scaled_dot_product_attention#0",
        _linear_columns("transformer.h.{}.attn.c_proj", 12),
    ),
    "llama-eager-gqa": Kind(
        _llama("eager"), 60, 6, "model.layers.{}.self_attn", "model.layers.{}.self_attn:matmul#1",
        _linear_columns("model.layers.{}.self_attn.o_proj", 8), kv_heads=2,
    ),
    "llama-sdpa-gqa": Kind(
        _llama("sdpa"), 60, 6, "model.layers.{}.self_attn",
        "model.layers.{}.self_attn:scaled_dot_product_attention#0",
        _linear_columns("model.layers.{}.self_attn.o_proj", 8), kv_heads=2,
    ),
    "gpt2-eager": Kind(
        lambda: tiny_gpt2(seed=1), 97, 4, "transformer.h.{}.attn", "transformer.h.{}.attn:matmul#1",
        _conv1d_rows("transformer.h.{}.attn.c_proj", 8),
    ),
    "gpt2-sdpa": Kind(
        lambda: tiny_gpt2(seed=1, attn_implementation="sdpa"), 97, 4, "transformer.h.{}.attn",
        "transformer.h.{}.attn:scaled_dot_product_attention#0",
        _conv1d_rows("transformer.h.{}.attn.c_proj", 8),
    ),
    "transformer-decoder": Kind(
        _decoder, 40, 4, "dec.layers.{}.self_attn", "",
        _linear_columns("dec.layers.{}.self_attn.out_proj", 6),
        extra="dec.layers.{}.multihead_attn",
    ),
}  # fmt: skip


@pytest.fixture(scope="module", params=list(KINDS))
def kind(request):
    k = KINDS[request.param]
    return k, k.build()


def _ids(vocab, seed=0, shape=(2, 7)):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=g)


def _logits(output):
    return output_logits(output)


def _surgery(kind, model, layer, head):
    other = copy.deepcopy(model)
    with torch.no_grad():
        kind.surgery(other, layer, head)
    return other


@pytest.mark.parametrize("layer,head", [(0, 0), (1, -1)])
def test_zeroing_a_head_by_module_path_equals_out_projection_surgery(kind, layer, head):
    kind, model = kind
    head = head % kind.heads
    ids = _ids(kind.vocab)
    path = kind.attention.format(layer)
    edit = Edit(path, Zero(), head=head)
    with torch.no_grad():
        expected = _logits(_surgery(kind, model, layer, head)(ids))
        plain = _logits(model(ids))
        hooked = _logits(run_edited(model, ids, edits=[edit]))
    traced = tracing.trace(model, ids, capture="values", edits=[edit])
    from_trace = _logits(traced.value(traced.steps[0].outputs[0]))
    torch.testing.assert_close(hooked, expected, rtol=0, atol=2e-6)
    torch.testing.assert_close(from_trace, expected, rtol=0, atol=2e-6)
    assert (hooked - plain).abs().max() > 1e-3  # the head mattered
    (entry,) = traced.meta["edits"]
    assert entry["steps"]  # it applied
    if kind.resolved:  # found inside the attention module, from the recorded map
        assert entry["site"] == kind.resolved.format(layer) and entry["via"] == path
        assert f"its per-head output {kind.resolved.format(layer)}" in entry["describe"]
    else:  # nn.MultiheadAttention: the module itself (tracing.capture.heads)
        assert entry["site"] == path and entry["via"] is None
    if kind.kv_heads:  # GQA: the query head, and the key/value head it reads
        group = kind.heads // kind.kv_heads
        assert (
            f"query head {head}; it shares key/value head {head // group} of 2"
            in (entry["describe"])
        )


def test_a_plan_resolves_once_and_keeps_the_site():
    """A plan reused on the same model does not look for the site again."""
    kind = KINDS["llama-sdpa-gqa"]
    model, ids = kind.build(), _ids(kind.vocab)
    from tracing.capture.edits import EditPlan

    plan = EditPlan.of([Edit("model.layers.0.self_attn", Zero(), head=5)])
    with torch.no_grad():
        first = run_edited(model, ids, edits=plan)
        resolved = plan.edits[0]
        second = run_edited(model, ids, edits=plan)
    assert plan.edits[0] is resolved and str(resolved.site).endswith("#0")
    assert torch.equal(first.logits, second.logits)


@pytest.mark.parametrize(
    "kind_name,path,message",
    [
        ("scratchformer", "", r"2 attention layers ran inside it.*blocks\.0\.self_attn\.attention"),
        ("transformer-decoder", "dec.layers.0", r"2 attention layers.*multihead_attn"),
        ("llama-sdpa-gqa", "model.layers.0.mlp", r"no attention map was recorded inside"),
    ],
)
def test_no_site_or_several_is_an_error_naming_the_sites(kind_name, path, message):
    kind = KINDS[kind_name]
    model, ids = kind.build(), _ids(kind.vocab)
    edit = Edit(path, Zero(), head=1)
    with pytest.raises(tracing.TraceError, match=message):
        tracing.trace(model, ids, capture="shapes", edits=[edit])
    with pytest.raises(EditError, match=message), torch.no_grad():
        run_edited(model, ids, edits=[edit])


def test_a_block_with_one_attention_resolves_to_it():
    kind = KINDS["nanogpt-sdpa"]
    model, ids = kind.build(), _ids(kind.vocab)
    with torch.no_grad():
        by_block = run_edited(model, ids, edits=[Edit("transformer.h.1", Zero(), head=2)])
        by_attn = run_edited(model, ids, edits=[Edit("transformer.h.1.attn", Zero(), head=2)])
    assert torch.equal(by_block, by_attn)


def test_heads_sweep_on_every_kind(kind):
    """One result per head per layer; a sweep that zeroes (``action=Zero()``) gives, in
    each cell, the metric of the single module-path edit of that head."""
    kind, model = kind
    clean = _ids(kind.vocab, seed=1, shape=(1, 6))
    corrupted = clean.clone()
    corrupted[0, 2] = (corrupted[0, 2] + 1) % kind.vocab
    rows = kind.rows()
    result = sweep(model, clean, corrupted, over="heads")
    assert result.values.shape == (len(rows), kind.heads) and torch.isfinite(result.values).all()
    assert result.runs == len(rows) * kind.heads
    assert result.rows == (rows if kind.extra else ["layer 0", "layer 1"])
    metric = _metric(model, clean)
    ablation = sweep(model, clean, clean, over="heads", action=Zero(), metric=metric)
    assert ablation.values.shape == (len(rows), kind.heads)
    for row, path, head in ((0, rows[0], 0), (len(rows) - 1, rows[-1], kind.heads - 1)):
        with torch.no_grad():
            single = metric(run_edited(model, clean, edits=[Edit(path, Zero(), head=head)]))
        assert ablation.values[row, head].item() == pytest.approx(single, abs=1e-5)
    assert (ablation.values - ablation.clean_metric).abs().max() > 1e-3  # heads mattered


def _metric(model, ids):
    with torch.no_grad():
        token = int(_logits(model(ids))[0, -1].argmax())

    def logit_of_clean_prediction(output):
        return float(_logits(output)[0, -1, token])

    return logit_of_clean_prediction
