"""Models and traces the tests share: the demo traced on its prompt, a tiny random GPT-2.

The session-scoped fixtures in ``conftest.py`` (``demo_model``, ``demo_shapes``,
``demo_stats``, ``demo_values``) trace the demo once per capture level for the whole run;
:func:`trace_demo` is for a test that needs its own model (an edited weight) or prompt.
Shared traces are read-only by convention: a test that changes one makes its own.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch

import scratchformer
import tracing

TINY = dict(vocab_size=50, block_size=16, d_model=32, n_heads=4, n_layers=2, d_ff=64)
"""Our model at its smallest useful size, every size distinct so every axis has one name:
C=32, H=4, D=8, V=50, F=64 (and the inputs' B and T chosen apart from them)."""


def tiny_config(**overrides) -> scratchformer.ModelConfig:
    """:data:`TINY` as a ``ModelConfig``, with ``overrides``."""
    return scratchformer.ModelConfig(**{**TINY, **overrides})


def tiny_model(seed: int | None = 0, **overrides) -> torch.nn.Module:
    """Our model at :func:`tiny_config` sizes with random weights (``seed``), in eval mode."""
    if seed is not None:
        torch.manual_seed(seed)
    return scratchformer.DecoderOnlyTransformer(tiny_config(**overrides)).eval()


def tensors_in(obj) -> list[torch.Tensor]:
    """Every tensor in a (nested) output: tuples, lists, dicts, Hugging Face ModelOutput."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, Mapping):
        return [t for v in obj.values() for t in tensors_in(v)]
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in tensors_in(v)]
    return []


def demo_ids(prompt: str = scratchformer.DEMO_PROMPT) -> torch.Tensor:
    """The prompt as the demo's byte tokens, shape (B=1, T)."""
    return torch.tensor([scratchformer.ByteTokenizer().encode(prompt)])


def trace_demo(
    model: torch.nn.Module | None = None,
    prompt: str = scratchformer.DEMO_PROMPT,
    capture: str = "values",
) -> tracing.Trace:
    """``model`` (the trained demo by default) traced on ``prompt``, with the tokens and the
    text in ``meta`` like the app records them."""
    ids = demo_ids(prompt)
    meta = {"tokens": ids[0].tolist(), "text": prompt}
    model = model if model is not None else scratchformer.demo_model()
    return tracing.trace(model, ids, capture=capture, meta=meta)


def tiny_gpt2(seed: int | None = 0, *, train: bool = False, **config):
    """A Hugging Face ``GPT2LMHeadModel`` with random weights (no download), 2 layers of
    width 32 and 4 heads over a 97-token vocabulary unless ``config`` says otherwise; eager
    attention so its attention weights exist. Skips the test when transformers is missing."""
    transformers = pytest.importorskip("transformers")
    settings = dict(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=97,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    settings.update(config)
    if seed is not None:
        torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**settings))
    return model.train() if train else model.eval()
