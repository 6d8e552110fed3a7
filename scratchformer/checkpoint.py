"""Checkpoints: weights in a ``.safetensors`` file, the config in its metadata. No pickle.

A safetensors file is a JSON header (tensor names, dtypes, shapes, offsets, plus a
free-form string->string ``__metadata__``) followed by raw tensor bytes. Reading one
executes no code, unlike ``torch.save``'s pickle, so opening a stranger's checkpoint is
safe. We store in the metadata:

- ``format``: ``"scratchformer"`` and ``format_version``: ``"1"``
- ``config``: the ``ModelConfig`` as JSON
- ``tokenizer``: the tokenizer kind (``"byte"``)
- ``extra``: optional JSON from the caller (training step, task, ...)

With tied weights the shared matrix is stored once (as ``token_embedding.weight``) and
re-tied when the model is rebuilt.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from scratchformer.config import ModelConfig
from scratchformer.model import DecoderOnlyTransformer

FORMAT_NAME = "scratchformer"
FORMAT_VERSION = 1
TOKENIZER_KINDS = ("byte", "gpt2")


class CheckpointError(ValueError):
    """A checkpoint cannot be loaded; the message names the problem and the file."""


# ---


def save_checkpoint(
    model: DecoderOnlyTransformer,
    path: str | os.PathLike,
    *,
    tokenizer: str = "byte",
    extra_meta: dict[str, Any] | None = None,
) -> Path:
    """Write ``model``'s weights and config to ``path`` (a ``.safetensors`` file).

    The file is written to a temporary name and renamed, so an interrupted save never
    leaves a half-written checkpoint under the real name.
    """
    path = Path(path)
    state = _state_to_save(model)
    metadata = {
        "format": FORMAT_NAME,
        "format_version": str(FORMAT_VERSION),
        "config": json.dumps(model.config.to_dict()),
        "tokenizer": tokenizer,
    }
    if extra_meta:
        metadata["extra"] = json.dumps(extra_meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(state, str(tmp), metadata=metadata)
    os.replace(tmp, path)
    os.chmod(path, 0o644)  # safetensors creates the file owner-only; a checkpoint is shareable
    return path


def _state_to_save(model: DecoderOnlyTransformer) -> dict[str, torch.Tensor]:
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_weights:
        del state["lm_head.weight"]  # the same tensor as token_embedding.weight
    return state


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's metadata: ``config`` (a dict), ``tokenizer``, ``extra`` (a dict)."""
    path = Path(path)
    raw = _open_header(path)
    return _parse_metadata(raw, path)


def load_checkpoint(path: str | os.PathLike, device: str | torch.device = "cpu"):
    """Rebuild the model saved at ``path``, in eval mode, on ``device``.

    Raises ``CheckpointError`` for a missing file, a file that is not a valid safetensors
    file (truncated, corrupt), a safetensors file without scratchformer metadata, an
    unsupported format version, a bad config, or tensors whose names or shapes do not
    match the config.
    """
    path = Path(path)
    meta = read_metadata(path)
    try:
        config = ModelConfig.from_dict(meta["config"])
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: invalid model config in metadata: {e}") from e

    model = DecoderOnlyTransformer(config)
    expected = _state_to_save(model)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            names = set(f.keys())
            missing = sorted(set(expected) - names)
            unexpected = sorted(names - set(expected))
            if missing or unexpected:
                parts = []
                if missing:
                    parts.append(f"missing tensors {_short(missing)}")
                if unexpected:
                    parts.append(f"unexpected tensors {_short(unexpected)}")
                raise CheckpointError(
                    f"{path}: tensors do not match the config ({'; '.join(parts)})"
                )
            state = {}
            for name in sorted(names):
                tensor = f.get_tensor(name)
                if tuple(tensor.shape) != tuple(expected[name].shape):
                    raise CheckpointError(
                        f"{path}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                        f"the config needs {tuple(expected[name].shape)}"
                    )
                state[name] = tensor
    except SafetensorError as e:
        raise CheckpointError(f"{path}: cannot read tensors (corrupt file?): {e}") from e

    # strict=False only because a tied lm_head.weight is not stored; names were checked
    model.load_state_dict(state, strict=False)
    if config.tie_weights:
        model.lm_head.weight = model.token_embedding.weight  # re-tie
    return model.to(device).eval()


# ---


def _open_header(path: Path) -> dict[str, str]:
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint file not found")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata()
    except (SafetensorError, OSError) as e:
        raise CheckpointError(
            f"{path}: not a valid safetensors file (truncated or corrupt?): {e}"
        ) from e
    return metadata or {}


def _parse_metadata(raw: dict[str, str], path: Path) -> dict[str, Any]:
    if raw.get("format") != FORMAT_NAME:
        raise CheckpointError(
            f"{path}: a safetensors file but not a scratchformer checkpoint "
            "(no 'format: scratchformer' in its metadata)"
        )
    version = raw.get("format_version", "")
    if version != str(FORMAT_VERSION):
        raise CheckpointError(
            f"{path}: checkpoint format version {version!r} is not supported "
            f"(this scratchformer reads version {FORMAT_VERSION})"
        )
    try:
        config = json.loads(raw["config"])
        extra = json.loads(raw["extra"]) if "extra" in raw else {}
    except (KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: missing or unreadable config in metadata: {e}") from e
    tokenizer = raw.get("tokenizer", "byte")
    if tokenizer not in TOKENIZER_KINDS:
        raise CheckpointError(f"{path}: unknown tokenizer kind {tokenizer!r}")
    return {"config": config, "tokenizer": tokenizer, "extra": extra}


def _short(names: list[str], n: int = 4) -> str:
    shown = ", ".join(names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")
