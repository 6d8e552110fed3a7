"""What a Hugging Face folder or config must be before ``transformers`` sees it.

A model folder is anyone's: a download, a colleague's, an attachment. Loading one may run
nothing and may not hang, so it is checked here first, each refusal one line saying why:

- **Its code never runs.** A ``config.json`` with ``auto_map`` names Python files of the
  folder (``modeling_x.py``) for transformers to import: refused, whatever its
  ``model_type`` (transformers would otherwise ask "run the custom code? [y/N]" or, told
  yes, run it). A ``model_type`` the installed transformers does not know is refused too:
  only custom code could build it. Every load also passes ``trust_remote_code=False``.
- **No pickle is reachable.** ``torch.load`` of a ``.bin`` / ``.pt`` can run code; the
  folder may hold none (not even beside safetensors: transformers falls back to it), an
  index (``*.index.json``) may name only ``.safetensors`` files inside the folder, and
  each ``.safetensors`` file must have a safetensors header (an empty one beside a ``.bin``
  index sends transformers to the pickle).
- **The config is bounded before anything is built**: its bytes (:data:`MAX_CONFIG_BYTES`),
  its nesting (:data:`MAX_CONFIG_DEPTH`), its keys and list items
  (:data:`MAX_CONFIG_ENTRIES`), and its layer counts (:data:`MAX_LAYERS`), so a hostile
  one is one error in a second rather than a machine busy until killed.

Plain Python, no Qt, no transformers import: the checks read JSON and file headers only.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any

from app.core.user_model import UserCodeError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
"""Weights in these files are pickles: never read."""

MAX_CONFIG_BYTES = 4 * 2**20
"""Largest ``config.json`` read (released ones are a few kB; a label map, some 100 kB)."""

MAX_CONFIG_DEPTH = 32
"""Deepest nesting of objects and lists in a config (real ones nest three or four)."""

MAX_CONFIG_ENTRIES = 50_000
"""Most keys and list items in a config, all levels together (~1 s for transformers)."""

MAX_LAYERS = 1024
"""Largest layer count a config may give (released models have up to ~130)."""

MAX_INDEX_BYTES = 64 * 2**20
"""Largest weight index (``*.index.json``) read."""


# --------------------------------------------------------------------------- the config


def read_config_data(path: Path) -> dict[str, Any]:
    """The JSON of ``config.json`` at ``path``, bounded, naming no code of its own."""
    data = _bounded_json(path, MAX_CONFIG_BYTES, "config")
    if not isinstance(data, dict) or "model_type" not in data:
        raise UserCodeError(f"{path}: not a Hugging Face config (it has no model_type)")
    _check_shape(path, data)
    auto_map = data.get("auto_map")
    if auto_map:
        names = auto_map if isinstance(auto_map, dict) else {}
        named = ", ".join(f"{k} -> {v}" for k, v in list(names.items())[:2])
        raise UserCodeError(
            f"{path}: the config names code of its own to run (auto_map: {named or auto_map}); "
            "scratchformer never runs a model folder's code. If its model_type "
            f"{str(data['model_type'])[:40]!r} is one transformers has built in, remove "
            "auto_map from config.json"
        )
    _check_layers(path, data)
    return data


def check_model_type(path: Path, model_type: Any, known) -> None:
    """``model_type`` must be one transformers builds itself (``known``: its mapping)."""
    if not isinstance(model_type, str) or model_type not in known:
        import transformers

        raise UserCodeError(
            f"{path}: model_type {str(model_type)[:60]!r} is not an architecture "
            f"transformers {transformers.__version__} has built in; a folder's own code "
            "would be needed to build it, and scratchformer never runs that"
        )


def _bounded_json(path: Path, limit: int, what: str) -> Any:
    try:
        size = os.stat(path).st_size
        if size > limit:
            raise UserCodeError(
                f"{path}: the {what} is {size:,} bytes, more than the {limit:,} read"
            )
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
        if len(raw) > limit:  # grown since, or not a regular file
            raise UserCodeError(f"{path}: the {what} is more than the {limit:,} bytes read")
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise UserCodeError(f"{path}: the {what} is nested too deeply to read") from None
    except (OSError, ValueError) as e:
        detail = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        raise UserCodeError(f"{path}: cannot read the {what} as JSON ({detail})") from None


def _check_shape(path: Path, data: Any) -> None:
    """Nesting and size of the config: at most :data:`MAX_CONFIG_DEPTH` levels and
    :data:`MAX_CONFIG_ENTRIES` keys and items (walked without recursion)."""
    entries = 0
    todo: list[tuple[Any, int]] = [(data, 1)]
    while todo:
        value, depth = todo.pop()
        if depth > MAX_CONFIG_DEPTH:
            raise UserCodeError(
                f"{path}: the config is nested more than {MAX_CONFIG_DEPTH} levels deep"
            )
        items = value.values() if isinstance(value, dict) else value
        entries += len(items)
        if entries > MAX_CONFIG_ENTRIES:
            raise UserCodeError(
                f"{path}: the config holds more than {MAX_CONFIG_ENTRIES:,} keys and items"
            )
        todo.extend((v, depth + 1) for v in items if isinstance(v, (dict, list)))


LAYER_COUNT = re.compile(r"^((num|n)_(\w+_)?layers?|(encoder|decoder)_layers|layers)$")
"""Keys that count layers: ``num_hidden_layers``, ``n_layer``, ``num_kv_shared_layers``,
``encoder_layers``... (every such key of transformers' configs), but not a size that
merely mentions layers (Gemma 3n's ``vocab_size_per_layer_input`` is 262,144)."""


def _check_layers(path: Path, data: dict, where: str = "") -> None:
    """Every layer count (:data:`LAYER_COUNT`), at any level (``text_config``), is at most
    :data:`MAX_LAYERS`."""
    for key, value in data.items():
        if isinstance(value, dict):
            _check_layers(path, value, f"{where}{key}.")
        elif (
            isinstance(value, int)
            and not isinstance(value, bool)
            and value > MAX_LAYERS
            and LAYER_COUNT.match(str(key).lower())
        ):
            raise UserCodeError(
                f"{path}: {where}{key} is {value:,}; scratchformer builds models of up to "
                f"{MAX_LAYERS:,} layers"
            )


# --------------------------------------------------------------------------- the weights


def check_weights(folder: Path) -> None:
    """A folder's weights are safetensors, and nothing in it leads to a pickle."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        raise UserCodeError(f"{folder}: cannot list it ({e.strerror or e})") from None
    pickles = [n for n in names if Path(n).suffix.lower() in PICKLE_SUFFIXES]
    if pickles:
        raise UserCodeError(
            f"{folder}: holds pickle weights {pickles[0]} (unpickling can run code, and "
            f"transformers may fall back to them); not loaded even with "
            f"torch.load(weights_only=True): move them out of the folder, or save them as "
            f"safetensors where you trust the file (model.save_pretrained(folder), "
            f"safetensors is its default), or give {folder / 'config.json'} for random weights"
        )
    for name in names:
        if name.endswith(".index.json"):
            _check_index(folder / name)
    weights = [n for n in names if n.endswith(".safetensors")]
    if not weights:
        raise UserCodeError(
            f"{folder}: no *.safetensors weights; give {folder / 'config.json'} for random weights"
        )
    for name in weights:
        _check_safetensors_header(folder / name)


def _check_index(path: Path) -> None:
    """A sharded checkpoint's index may name only ``.safetensors`` files in its folder."""
    data = _bounded_json(path, MAX_INDEX_BYTES, "weight index")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise UserCodeError(f"{path}: not a weight index (no weight_map)")
    for file in set(map(str, weight_map.values())):
        if not file.endswith(".safetensors"):
            raise UserCodeError(
                f"{path}: the index names {file[:80]!r}, not a .safetensors file (a pickle "
                "is never read); remove the index or save the weights as safetensors"
            )
        if Path(file).name != file or file.startswith("."):
            raise UserCodeError(f"{path}: the index names {file[:80]!r}, not a file of this folder")


def _check_safetensors_header(path: Path) -> None:
    """``path`` starts as a safetensors file does: a length, then a JSON object that fits."""
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError as e:
        raise UserCodeError(f"{path}: cannot read it ({e.strerror or e})") from None
    length = struct.unpack("<Q", head[:8])[0] if len(head) >= 8 else None
    if length is None or len(head) < 9 or head[8:9] != b"{" or 8 + length > size:
        raise UserCodeError(
            f"{path}: not a safetensors file ({size:,} bytes, no header that fits); "
            "nothing in the folder was loaded"
        )
