"""Scratchformer's model: a decoder-only Transformer written from scratch in PyTorch.

>>> from scratchformer import ModelConfig, DecoderOnlyTransformer, ByteTokenizer
>>> model = DecoderOnlyTransformer(ModelConfig.preset("demo"))
>>> tok = ByteTokenizer()
>>> logits = model(torch.tensor([tok.encode("hello")]))   # doctest: +SKIP  (1, 5, 256)

This package imports neither ``tracing`` nor ``app``: the model knows nothing of the
debugger that inspects it.
"""

from scratchformer.attention import MultiHeadAttention, ScaledDotProductAttention
from scratchformer.block import DecoderBlock
from scratchformer.checkpoint import (
    CheckpointError,
    load_checkpoint,
    read_metadata,
    save_checkpoint,
)
from scratchformer.config import ModelConfig
from scratchformer.demo import DEMO_PROMPT, DEMO_TASK, demo_checkpoint_path, demo_model
from scratchformer.feed_forward import PositionWiseFeedForward
from scratchformer.model import DecoderOnlyTransformer
from scratchformer.positional import LearnedPositionalEncoding, SinusoidalPositionalEncoding
from scratchformer.tokenizer import ByteTokenizer

__all__ = [
    "DEMO_PROMPT",
    "DEMO_TASK",
    "ByteTokenizer",
    "CheckpointError",
    "DecoderBlock",
    "DecoderOnlyTransformer",
    "LearnedPositionalEncoding",
    "ModelConfig",
    "MultiHeadAttention",
    "PositionWiseFeedForward",
    "ScaledDotProductAttention",
    "SinusoidalPositionalEncoding",
    "demo_checkpoint_path",
    "demo_model",
    "load_checkpoint",
    "read_metadata",
    "save_checkpoint",
]
