"""Load Hugging Face GPT-2 weights into our ``DecoderOnlyTransformer``.

Our model is laid out like GPT-2, so conversion is renaming plus two details:

- GPT-2 uses ``Conv1D`` layers, which compute ``x @ W + b`` with ``W`` shaped
  (in, out); ``nn.Linear`` computes ``x @ W.T + b`` with ``W`` shaped (out, in). Every
  Conv1D weight is therefore transposed.
- GPT-2 projects Q, K and V with one fused ``c_attn`` (C -> 3C); we keep the seed's three
  separate ``W_q``, ``W_k``, ``W_v``. The fused weight is split into thirds, in that order.

With internet access, the real 124M GPT-2 loads like this (``transformers`` is a dev
dependency; nothing in scratchformer downloads anything itself)::

    from transformers import GPT2LMHeadModel, GPT2TokenizerFast
    from scratchformer import save_checkpoint
    from scratchformer.convert import from_hf_gpt2

    hf = GPT2LMHeadModel.from_pretrained("gpt2")        # downloads ~500 MB once
    model = from_hf_gpt2(hf)                            # our module tree, same weights
    save_checkpoint(model, "gpt2.safetensors", tokenizer="gpt2")
    ids = GPT2TokenizerFast.from_pretrained("gpt2")("Hello", return_tensors="pt").input_ids
    logits = model(ids)                                 # equals hf(ids).logits to ~1e-4
"""

from __future__ import annotations

import torch

from scratchformer.config import ModelConfig
from scratchformer.model import DecoderOnlyTransformer

# GPT-2 activation names that are the tanh approximation of GELU (our "gelu")
_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def config_from_hf_gpt2(hf_config) -> ModelConfig:
    """The ``ModelConfig`` matching a ``transformers.GPT2Config``."""
    activation = hf_config.activation_function
    if activation in _TANH_GELUS:
        activation = "gelu"
    elif activation != "relu":
        raise ValueError(f"GPT-2 activation {activation!r} is not supported (use gelu_new or relu)")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if getattr(hf_config, flag, False):
            raise ValueError(f"GPT2Config.{flag}=True is not supported")
    if not getattr(hf_config, "scale_attn_weights", True):
        raise ValueError("GPT2Config.scale_attn_weights=False is not supported")
    return ModelConfig(
        vocab_size=hf_config.vocab_size,
        block_size=hf_config.n_positions,
        d_model=hf_config.n_embd,
        n_heads=hf_config.n_head,
        n_layers=hf_config.n_layer,
        d_ff=hf_config.n_inner or 4 * hf_config.n_embd,
        dropout=hf_config.resid_pdrop,
        activation=activation,
        norm_position="pre",
        positional="learned",
        tie_weights=bool(getattr(hf_config, "tie_word_embeddings", True)),
        bias=True,
        layer_norm_eps=hf_config.layer_norm_epsilon,
    )


def from_hf_gpt2(hf_model) -> DecoderOnlyTransformer:
    """Build our model from a ``transformers.GPT2LMHeadModel`` with the same weights.

    Returns the model in eval mode. Its logits match ``hf_model(idx).logits`` (in eval
    mode) to float rounding.
    """
    config = config_from_hf_gpt2(hf_model.config)
    sd = {k: v.detach() for k, v in hf_model.state_dict().items()}
    C = config.d_model

    def take(name: str) -> torch.Tensor:
        key = f"transformer.{name}"
        if key not in sd:
            raise ValueError(f"Hugging Face state dict has no {key!r}; is it a GPT-2 model?")
        return sd[key]

    state: dict[str, torch.Tensor] = {
        "token_embedding.weight": take("wte.weight"),
        "position_encoding.embedding.weight": take("wpe.weight"),
        "final_norm.weight": take("ln_f.weight"),
        "final_norm.bias": take("ln_f.bias"),
    }
    for i in range(config.n_layers):
        h, b = f"h.{i}.", f"blocks.{i}."
        state[b + "norm1.weight"] = take(h + "ln_1.weight")
        state[b + "norm1.bias"] = take(h + "ln_1.bias")
        state[b + "norm2.weight"] = take(h + "ln_2.weight")
        state[b + "norm2.bias"] = take(h + "ln_2.bias")
        # fused Q|K|V: Conv1D weight (C, 3C) -> three Linear weights (C, C), transposed
        qkv_w = take(h + "attn.c_attn.weight")  # (C, 3C)
        qkv_b = take(h + "attn.c_attn.bias")  # (3C,)
        for j, name in enumerate(("W_q", "W_k", "W_v")):
            state[b + f"self_attn.{name}.weight"] = qkv_w[:, j * C : (j + 1) * C].t()
            state[b + f"self_attn.{name}.bias"] = qkv_b[j * C : (j + 1) * C]
        state[b + "self_attn.W_o.weight"] = take(h + "attn.c_proj.weight").t()
        state[b + "self_attn.W_o.bias"] = take(h + "attn.c_proj.bias")
        state[b + "feed_forward.linear1.weight"] = take(h + "mlp.c_fc.weight").t()  # (F, C)
        state[b + "feed_forward.linear1.bias"] = take(h + "mlp.c_fc.bias")
        state[b + "feed_forward.linear2.weight"] = take(h + "mlp.c_proj.weight").t()  # (C, F)
        state[b + "feed_forward.linear2.bias"] = take(h + "mlp.c_proj.bias")
    if not config.tie_weights:
        state["lm_head.weight"] = sd["lm_head.weight"]

    model = DecoderOnlyTransformer(config)
    missing, unexpected = model.load_state_dict(
        {k: v.contiguous() for k, v in state.items()}, strict=False
    )
    missing = [k for k in missing if not (config.tie_weights and k == "lm_head.weight")]
    if missing or unexpected:  # pragma: no cover - a bug in the mapping above
        raise RuntimeError(f"conversion mismatch: missing {missing}, unexpected {unexpected}")
    return model.eval()
