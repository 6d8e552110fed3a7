"""A model rebuilt from its constructor's sizes: knob passes for a class with no config.

A Hugging Face model takes its sizes from a ``.config``, which a knob pass copies with one
size moved. A model written by hand takes them as arguments (``TutorialLM(vocab_size=256,
d_model=32, num_heads=4, d_ff=128)``), which it keeps nowhere. :class:`Constructor` is the
class and the arguments it was built with: it acts as the config (a dict of the integer
arguments, each a knob) and as the rebuild (``cls(**config)``)::

    model = ViT(image_size=28, patch_size=4, embed_dim=60, num_heads=4, mlp_dim=120)
    trace = tracing.trace(model, images, rebuild=Constructor(ViT, image_size=28, patch_size=4,
                                                             embed_dim=60, num_heads=4,
                                                             mlp_dim=120))

``scratchformer trace --model file.py:Name`` builds a class with no arguments, so its
defaults are the sizes it was built with: :meth:`Constructor.of_defaults`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any


class Constructor:
    """``cls`` and the keyword arguments it was (or would be) built with."""

    def __init__(self, cls: Any, /, **kwargs: Any):
        if not callable(cls):
            raise TypeError(f"Constructor needs a class or a function, not {cls!r}")
        self.cls = cls
        self.kwargs = dict(kwargs)

    @property
    def config(self) -> dict[str, int]:
        """The integer arguments: the sizes a knob pass may move (a bool is no size)."""
        return {
            k: v for k, v in self.kwargs.items() if isinstance(v, int) and not isinstance(v, bool)
        }

    def __call__(self, config: Mapping[str, Any]) -> Any:
        """The model built again with ``config``'s sizes (the other arguments as given)."""
        return self.cls(**{**self.kwargs, **dict(config)})

    @classmethod
    def of_defaults(cls, target: Any) -> Constructor | None:
        """``target`` as built with no arguments: its integer defaults are its sizes.
        ``None`` where it has none or its signature cannot be read."""
        try:
            params = inspect.signature(target).parameters.values()
        except (TypeError, ValueError):
            return None
        kwargs = {
            p.name: p.default
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and isinstance(p.default, int)
            and not isinstance(p.default, bool)
        }
        return cls(target, **kwargs) if kwargs else None

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"Constructor({getattr(self.cls, '__qualname__', self.cls)}, {args})"
