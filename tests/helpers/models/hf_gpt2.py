"""A Hugging Face GPT-2 built from a config (random weights, nothing downloaded)."""

import transformers


def tiny_gpt2():
    config = transformers.GPT2Config(
        vocab_size=80, n_positions=32, n_embd=32, n_layer=2, n_head=4,
        attn_implementation="eager",
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()
