"""``ModelConfig``: every number and switch that defines a model, in one dataclass.

A config is plain data: it round-trips through JSON (``to_dict`` / ``from_dict``), which is
how a checkpoint remembers what model its weights belong to. Named presets give the sizes
people talk about:

>>> ModelConfig.preset("gpt2-small").n_layers
12

Shape letters used in comments across the package: ``B`` batch, ``T`` time (sequence
position), ``C`` d_model, ``H`` heads, ``D`` d_head, ``V`` vocab, ``F`` d_ff.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

ACTIVATIONS = ("gelu", "relu")
NORM_POSITIONS = ("pre", "post")
POSITIONALS = ("learned", "sinusoidal")


@dataclass
class ModelConfig:
    """The hyper-parameters of a ``DecoderOnlyTransformer``."""

    vocab_size: int = 256  # V: number of distinct tokens (256 = raw bytes)
    block_size: int = 64  # longest sequence the model can see (max T)
    d_model: int = 64  # C: width of the residual stream
    n_heads: int = 4  # H: attention heads per layer (d_model must divide evenly)
    n_layers: int = 2  # number of stacked DecoderBlocks
    d_ff: int = 256  # F: hidden width of the feed-forward network (usually 4 * C)
    dropout: float = 0.0  # on embeddings and on each residual branch; 0 at inference
    activation: str = "gelu"  # "gelu" (tanh approximation, as GPT-2) or "relu" (the seed)
    norm_position: str = "pre"  # "pre": x + f(LN(x)) (the seed, GPT-2); "post": LN(x + f(x))
    positional: str = "learned"  # "learned" embedding table, or fixed "sinusoidal" (Vaswani)
    tie_weights: bool = True  # lm_head shares the token embedding matrix (GPT-2 does)
    bias: bool = True  # biases in Linear layers and LayerNorms
    layer_norm_eps: float = 1e-5

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        # the bundled demo: small enough to train on a laptop CPU in minutes
        "demo": dict(vocab_size=256, block_size=64, d_model=64, n_heads=4, n_layers=2, d_ff=256),
        # a slightly larger byte-level model for training on a text file
        "nano": dict(vocab_size=256, block_size=128, d_model=128, n_heads=4, n_layers=4, d_ff=512),
        # OpenAI's GPT-2 small (124M): loads Hugging Face weights via scratchformer.convert
        "gpt2-small": dict(
            vocab_size=50257,
            block_size=1024,
            d_model=768,
            n_heads=12,
            n_layers=12,
            d_ff=3072,
            dropout=0.1,
        ),
    }

    # ---

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "d_model", "n_heads", "n_layers", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                "every head gets d_model // n_heads dimensions"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        for name, allowed in (
            ("activation", ACTIVATIONS),
            ("norm_position", NORM_POSITIONS),
            ("positional", POSITIONALS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")

    @property
    def d_head(self) -> int:
        """D: width of one attention head."""
        return self.d_model // self.n_heads

    # ---

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A named configuration ("demo", "nano", "gpt2-small"), optionally adjusted."""
        if name not in cls.PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(cls.PRESETS)}")
        return cls(**{**cls.PRESETS[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of the fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of ``to_dict``; unknown or missing keys raise ``ValueError``."""
        if not isinstance(data, dict):
            raise ValueError(f"a model config must be a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown model config field(s): {', '.join(unknown)}")
        missing = sorted(names - set(data))
        if missing:
            raise ValueError(f"model config is missing field(s): {', '.join(missing)}")
        return cls(**data)
