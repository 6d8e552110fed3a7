"""Tiny Hugging Face causal LMs for the dims tests, built from configs (random weights).

Sizes chosen so that no two coincide: B=3, T=11, C=96, H=6, 2 KV heads, D=16, F=200,
V=101 (``SIZES``); ``shrunk(config, **over)`` applies them to any architecture's config.
"""

from __future__ import annotations

import contextlib

import torch

SIZES = dict(B=3, T=11, C=96, H=6, KV=2, D=16, F=200, V=101)

_SET = {
    "hidden_size": 96, "n_embd": 96, "d_model": 96, "embed_dim": 96,
    "num_attention_heads": 6, "n_head": 6, "n_heads": 6, "num_heads": 6,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 200, "n_inner": 200,
    "ffn_dim": 200, "d_ff": 200, "ffn_hidden_size": 200, "vocab_size": 101, "pad_token_id": 0,
    "num_hidden_layers": 1, "n_layer": 1, "n_layers": 1, "num_layers": 1,
    "max_position_embeddings": 64, "n_positions": 64, "n_ctx": 64,
}  # fmt: skip


def shrunk(config, **over):
    """``config`` with the test sizes wherever it has the attribute, then ``over``."""
    for name, value in {**_SET, **over}.items():
        if hasattr(config, name) or name in over:
            with contextlib.suppress(AttributeError):  # a derived property (Falcon's head_dim)
                setattr(config, name, value)
    config._attn_implementation = "eager"
    return config


def build(kind: str, **over):
    """(model, token ids) for one named architecture at the test sizes."""
    import transformers as tf

    config = {
        "llama": lambda: tf.LlamaConfig(),
        "qwen2": lambda: tf.Qwen2Config(num_key_value_heads=1),
        "gpt_neox": lambda: tf.GPTNeoXConfig(),
        "mixtral": lambda: tf.MixtralConfig(num_local_experts=5, num_experts_per_tok=2),
        "gpt2": lambda: tf.GPT2Config(),
        "falcon": lambda: tf.FalconConfig(new_decoder_architecture=True, num_kv_heads=2),
        "phi3": lambda: tf.Phi3Config(),
        "gemma2": lambda: tf.Gemma2Config(),
        "deepseek_v3": lambda: tf.DeepseekV3Config(
            n_routed_experts=5,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=0,
            moe_intermediate_size=40,
            q_lora_rank=24,
            kv_lora_rank=28,
            qk_nope_head_dim=12,
            qk_rope_head_dim=8,
            v_head_dim=10,
        ),
    }[kind]()
    if kind == "deepseek_v3":  # its rotary width is its head_dim
        over = {"head_dim": 8, "num_key_value_heads": 6, **over}
    shrunk(config, **over)
    if kind == "qwen2":
        config.num_key_value_heads = 1
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    b, t = over.get("B", SIZES["B"]), over.get("T", SIZES["T"])
    return model, torch.randint(0, config.vocab_size, (b, t))


SMALL = dict(vocab_size=101, pad_token_id=0, bos_token_id=1, eos_token_id=2)
"""The vocabulary and special tokens of :func:`from_config`'s models (V = 101)."""


def from_config(config_class, model_class, **kwargs):
    """(model, token ids (B=3, T=11)) of ``model_class`` built from ``config_class(**SMALL,
    **kwargs)``, eager attention, seeded random weights (an architecture ``build`` above
    does not list, with exactly the sizes a test gives)."""
    import warnings

    config = config_class(**{**SMALL, **kwargs})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_class(config).eval()
    return model, torch.randint(3, SMALL["vocab_size"], (SIZES["B"], SIZES["T"]))


def steps_of(trace, suffix: str, min_rank: int = 1) -> list[tuple[str, str, str]]:
    """``(module below it, op, "(B,T,C) ...")`` for every op of the first call of the module
    whose path ends in ``suffix`` (its first output of rank ``min_rank`` or more)."""
    first = next(s for s in trace.steps if s.kind == "module" and s.module.endswith(suffix))
    return [
        (
            s.module[len(first.module) :].lstrip("."),
            s.op,
            " ".join("(" + ",".join(trace.tensor(i).dims or ()) + ")" for i in s.outputs),
        )
        for s in trace.steps[first.index : first.end + 1]
        if s.kind == "op" and s.outputs and len(trace.tensor(s.outputs[0]).shape) >= min_rank
    ]
