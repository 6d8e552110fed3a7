"""Models with every attention the tracer recognises, each with the weight surgery that
zeroes one head (its input columns of the output projection): the independent reference
for head edits (``tests/tracing/capture/test_head_edits_any.py``, the app's head menu)."""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass

import torch
from torch import nn

from helpers.own_models import NANOGPT, TUTORIAL_FIXED
from helpers.tiny_models import tiny_gpt2, tiny_model


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
        import transformers

        torch.manual_seed(0)
        config = transformers.LlamaConfig(
            vocab_size=60, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=32,
            attn_implementation=impl,
        )  # fmt: skip
        return transformers.LlamaForCausalLM(config).eval()

    return build


def _gpt_oss():
    """GPT-OSS (eager): attention sinks, a softmax over the keys and one sink column per
    head whose map (``probs[..., :-1]``) is a slice of the softmax's output."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GptOssConfig(
        vocab_size=60, hidden_size=48, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, head_dim=8, num_local_experts=2,
        num_experts_per_tok=1, max_position_embeddings=32, layer_types=["full_attention"] * 2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attn_implementation="eager",
    )  # fmt: skip
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():  # sinks that take a real share of each row
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
    return model


def _folded():
    """XGLM (eager): attention by ``bmm`` with the heads folded into the batch, ``(B·H, T,
    S)`` maps and ``(B·H, T, D)`` per-head outputs (Bloom's the same, checked in
    ``benchmarks/bench_attention_architectures.py``: its random weights are too small for
    a head's zeroing to move the sweep's metric)."""

    def build():
        import transformers

        torch.manual_seed(0)
        config = transformers.XGLMConfig(
            vocab_size=60, d_model=48, ffn_dim=64, num_layers=2, attention_heads=6,
            attn_implementation="eager",
        )  # fmt: skip
        return transformers.XGLMForCausalLM(config).eval()

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
    "gpt-oss-sinks": Kind(
        _gpt_oss, 60, 6, "model.layers.{}.self_attn", "model.layers.{}.self_attn:matmul#1",
        _linear_columns("model.layers.{}.self_attn.o_proj", 8), kv_heads=2,
    ),
    "xglm-folded": Kind(
        _folded(), 60, 6, "model.layers.{}.self_attn", "model.layers.{}.self_attn:bmm#1",
        _linear_columns("model.layers.{}.self_attn.out_proj", 8),
    ),
    "transformer-decoder": Kind(
        _decoder, 40, 4, "dec.layers.{}.self_attn", "",
        _linear_columns("dec.layers.{}.self_attn.out_proj", 6),
        extra="dec.layers.{}.multihead_attn",
    ),
}  # fmt: skip


def surgery(kind: Kind, model: nn.Module, layer: int, head: int) -> nn.Module:
    """A copy of ``model`` with head ``head`` of layer ``layer`` zeroed by weight surgery."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        kind.surgery(other, layer, head)
    return other


def ids(vocab: int, seed: int = 0, shape=(2, 7)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=g)
