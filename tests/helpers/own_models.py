"""The three kinds of model a user brings (``models/``), loaded as ``--model`` does."""

from __future__ import annotations

from pathlib import Path

MODELS = Path(__file__).resolve().parent / "models"
TUTORIAL = MODELS / "tutorial.py"  # the tutorial's classes verbatim: forgets to import F
TUTORIAL_FIXED = MODELS / "tutorial_fixed.py"
NANOGPT = MODELS / "nanogpt.py"
HF_GPT2 = MODELS / "hf_gpt2.py"


def load(path: Path, name: str, **inputs):
    from app.core.user_model import InputSpec, ModelSpec
    from app.core.user_model import load as load_model

    return load_model(ModelSpec(path, name), InputSpec(**inputs))
