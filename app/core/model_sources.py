"""Where a ``--model`` comes from: the one loader every command and the app use.

``--model`` takes any of:

- ``FILE.py:NAME``: a person's own model (:mod:`app.core.user_model` builds it);
- a Hugging Face model folder (``config.json`` plus ``*.safetensors`` weights), loaded
  offline with ``transformers``; pickle weights (``pytorch_model.bin``, ``*.pt``) are
  refused, never unpickled, and no code of the folder runs (:mod:`app.core.folder_checks`
  checks it first);
- a ``config.json`` alone: the architecture with random weights, for shape work (on
  ``--device meta`` no memory is spent on weights at all).

``--device`` (``cpu``, ``cuda``, ``meta``) says where the model is built and run.

A tokenizer travels with the model: the folder's ``tokenizer.json`` (read with the small
``tokenizers`` library it is written for), or ``--tokenizer PATH`` for a file model; our
own models keep the byte tokenizer. The prompt is encoded as the model expects, and the
trace's meta carries the token strings (``token_labels`` for the prompt, and
``token_strings`` for every id of the vocabulary, bounded: :mod:`app.core.token_text`), so
every token any view shows is the tokenizer's, in this process or from the saved file,
which never needs the tokenizer again.

Every failure is one :class:`UserCodeError` line. Plain Python, no Qt.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from app.core import token_text
from app.core.folder_checks import (
    check_model_type,
    check_weights,
    read_config_data,
)
from app.core.user_model import (
    InputSpec,
    LoadedModel,
    ModelSpec,
    UserCodeError,
    build,
    import_file,
    make_inputs,
)
from tracing.safe_text import inert_document

DEVICES = ("cpu", "cuda", "meta")
INSTALL_HF = 'pip install "scratchformer[hf]"'
MAX_TOKENIZER_BYTES = 256 * 2**20
"""Largest ``tokenizer.json`` read (it is parsed whole; released ones are up to ~35 MB)."""
MODEL_HELP = (
    "the model: FILE.py:NAME (your own), a Hugging Face model folder (config.json + "
    "safetensors, offline), or a config.json alone (random weights)"
)


# --------------------------------------------------------------------------- what --model names


@dataclass(frozen=True)
class SourceSpec:
    """``--model`` parsed: a file model, a Hugging Face folder, or a config file."""

    kind: Literal["file", "folder", "config"]
    path: Path
    name: str = ""  # kind "file": the object in the file

    @classmethod
    def parse(cls, text: str) -> SourceSpec:
        if not text:
            raise UserCodeError("--model is empty")
        path = Path(text).expanduser()
        if path.is_dir():
            return cls("folder", path)
        if path.suffix == ".json":
            if not path.is_file():
                raise UserCodeError(f"no such config file: {path}")
            return cls("config", path)
        if not text.rpartition(":")[0] and not path.exists():
            raise UserCodeError(
                f"--model {text!r}: no such folder or file; give FILE.py:NAME, a Hugging "
                f"Face model folder or a config.json"
            )
        spec = ModelSpec.parse(text)
        return cls("file", spec.file, spec.name)

    def __str__(self) -> str:
        return f"{self.path}:{self.name}" if self.kind == "file" else str(self.path)


# --------------------------------------------------------------------------- tokenizers


class TextTokenizer:
    """A ``tokenizer.json`` (Hugging Face ``tokenizers``): text to ids, ids to strings."""

    def __init__(self, path: Path):
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise UserCodeError(f"reading {path.name} needs tokenizers: {INSTALL_HF}") from e
        size = path.stat().st_size
        if size > MAX_TOKENIZER_BYTES:  # read whole by tokenizers: bounded like a config
            raise UserCodeError(
                f"{path}: the tokenizer is {size:,} bytes, more than the "
                f"{MAX_TOKENIZER_BYTES:,} read (released ones are tens of MB)"
            )
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:
            detail = " ".join(str(e).split())[:200]
            raise UserCodeError(f"{path}: not a tokenizer.json ({detail})") from e
        self.path = path
        self._kind = token_text.decoder_kind(self._tok)
        self._special = frozenset(self._tok.get_added_tokens_decoder())

    def encode(self, text: str) -> list[int]:
        """The ids the model expects, special tokens (a BOS) included as the file says."""
        return self._tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token_str(self, i: int) -> str:
        """One token as the text it stands for (``" hello"``, a part of a character as
        ``\\xe2``): :func:`app.core.token_text.token_text`."""
        return token_text.token_text(self._tok, int(i), self._kind, self._special)

    def token_strings(self, ids: list[int]) -> list[str]:
        return [self.token_str(i) for i in ids]

    def recorded_strings(self, prompt: list[int]) -> dict[str, str]:
        """What a trace keeps of this tokenizer (``meta["token_strings"]``, bounded)."""
        return token_text.recorded_strings(self._tok, self._kind, self._special, prompt)


def find_tokenizer(path: str | Path | None, model_path: Path | None = None) -> TextTokenizer | None:
    """``path`` (a ``tokenizer.json`` or a folder holding one), else the one beside the
    model (in its folder, or beside its config.json), else None (bytes)."""
    if path:
        p = Path(path).expanduser()
        file = p / "tokenizer.json" if p.is_dir() else p
        if not file.is_file():
            raise UserCodeError(f"no tokenizer.json at {p}")
        return TextTokenizer(file)
    if model_path is not None:
        folder = model_path if model_path.is_dir() else model_path.parent
        if (folder / "tokenizer.json").is_file():
            return TextTokenizer(folder / "tokenizer.json")
    return None


def model_reads(text: str | None, tokenizer: str | Path | None = None) -> list[Path]:
    """Every file :func:`load` reads for ``--model text`` (and ``--tokenizer``): what no
    output may replace. A folder stands for everything in it (``from_pretrained`` reads
    its config, weights, index and generation config; the tokenizer is beside them); a
    ``config.json`` brings the ``tokenizer.json`` beside it; a file model is its file and
    the ``.py`` files beside it (its folder is first on ``sys.path`` while it imports).
    Never raises: a ``text`` the loader will refuse reads what its spelling names."""
    reads: list[Path] = []
    if text:
        path = Path(text).expanduser()
        if path.is_dir():
            reads.append(path)
        elif path.suffix == ".json":
            reads += [path, path.parent / "tokenizer.json"]
        else:  # a file model, and the modules beside it, which it may import
            file, sep, _name = text.rpartition(":")
            path = Path(file if sep and file else text).expanduser()
            reads.append(path)
            with contextlib.suppress(OSError):
                reads += sorted(path.parent.glob("*.py"))[:1000]
    if tokenizer:
        path = Path(tokenizer).expanduser()
        reads.append(path / "tokenizer.json" if path.is_dir() else path)
    return reads


# --------------------------------------------------------------------------- building


def _transformers():
    try:
        import transformers
    except ImportError as e:
        raise UserCodeError(f"a Hugging Face model needs transformers: {INSTALL_HF}") from e
    _inert_messages(transformers)
    return transformers


class _InertRecords(logging.Filter):
    """transformers' own warnings may quote a folder's config: each message is made inert
    (``tracing.safe_text``) before its handler writes it to the terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = inert_document(record.getMessage()), ()
        return True


def _inert_messages(transformers) -> None:
    transformers.utils.logging.get_logger("transformers")  # makes its handler
    for handler in logging.getLogger("transformers").handlers:
        if not any(isinstance(f, _InertRecords) for f in handler.filters):
            handler.addFilter(_InertRecords())


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def _read_config(path: Path):
    """The transformers config of ``config.json`` at ``path``, checked first
    (:mod:`app.core.folder_checks`: bounded, no code of its own, a built-in model_type)."""
    data = read_config_data(path)  # before transformers is imported: a refusal is quick
    transformers = _transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    check_model_type(path, data["model_type"], CONFIG_MAPPING)
    try:
        return transformers.AutoConfig.for_model(**data)
    except Exception as e:
        raise UserCodeError(f"{path}: {_one_line(e)}") from e


def _config_dtype(config, device: str):
    """The dtype the config names on ``meta`` (shapes as released: Mixtral's bf16);
    float32 where values are computed on the CPU."""
    import torch

    name = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if device == "meta" and name is not None:
        dtype = name if isinstance(name, torch.dtype) else getattr(torch, str(name), None)
        if isinstance(dtype, torch.dtype):
            return dtype
    return torch.float32


def _from_config(config, device: str, seed: int):
    import torch

    transformers = _transformers()
    if device != "meta":
        _check_memory(config, device)
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            return transformers.AutoModelForCausalLM.from_config(
                config, dtype=_config_dtype(config, device), trust_remote_code=False
            )
    except Exception as e:
        raise UserCodeError(f"cannot build {type(config).__name__}: {_one_line(e)}") from e


def _check_memory(config, device: str) -> None:
    """Random weights for ``config`` must fit in the memory free on ``device``: the model
    is built on ``meta`` first (no memory, a second at most) and its bytes counted."""
    import torch

    model = _from_config(config, "meta", 0)
    need = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    free = torch.cuda.mem_get_info()[0] if device == "cuda" else _available_memory()
    if need > free:
        raise UserCodeError(
            f"{type(config).__name__}'s weights need {need / 2**30:,.1f} GiB and {device} has "
            f"{free / 2**30:,.1f} GiB free; --device meta traces its shapes without them"
        )


def _available_memory() -> int:
    """Bytes of memory this machine can give without swapping (Linux's MemAvailable,
    which counts the page cache it can drop), else the free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _from_folder(folder: Path, device: str, seed: int):
    transformers = _transformers()
    if not (folder / "config.json").is_file():
        raise UserCodeError(f"{folder}: not a Hugging Face model folder (no config.json)")
    config = _read_config(folder / "config.json")  # checked before transformers reads it
    if device == "meta":  # the weights would not be read: the architecture is enough
        return _from_config(config, device, seed)
    check_weights(folder)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(folder), config=config, local_files_only=True, use_safetensors=True,
            dtype="auto", trust_remote_code=False,
        )  # fmt: skip
    except Exception as e:
        raise UserCodeError(f"{folder}: {_one_line(e)}") from e
    return model.to(device)


def _check_device(device: str) -> None:
    import torch

    if device not in DEVICES:
        raise UserCodeError(f"--device is one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserCodeError("--device cuda: no CUDA device is available here")


def _to_device(value: Any, device: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to_device(v, device) for v in value)
    if isinstance(value, list):
        return [_to_device(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value


# --------------------------------------------------------------------------- the loader


def load(
    text: str,
    inputs: InputSpec | None = None,
    *,
    device: str = "cpu",
    tokenizer: str | Path | None = None,
    seed: int = 0,
) -> LoadedModel:
    """Build the model ``text`` names on ``device``, in eval mode, with its inputs and
    the meta that describes them (tokens, their strings, where the model came from)."""
    import torch

    inputs = inputs or InputSpec()
    _check_device(device)
    spec = SourceSpec.parse(text)
    module = None
    if spec.kind == "file":
        module = import_file(spec.path)
        context = torch.device("meta") if device == "meta" else contextlib.nullcontext()
        with context:
            model = build(module, spec.name, spec.path)
        model = model.to(device) if device == "cuda" else model
    elif spec.kind == "folder":
        model = _from_folder(spec.path, device, seed)
    else:
        model = _from_config(_read_config(spec.path), device, seed)
    model.eval()
    tok = find_tokenizer(tokenizer, spec.path if spec.kind != "file" else None)

    if tok is not None and inputs.prompt is not None and inputs.shape is None:
        loaded = _tokenized(model, tok, inputs.prompt)
    else:
        loaded = make_inputs(model, module, inputs)
    loaded.args, loaded.kwargs = _to_device(loaded.args, device), _to_device(loaded.kwargs, device)
    if tok is not None and loaded.meta.get("tokens"):
        loaded.meta["token_labels"] = tok.token_strings(loaded.meta["tokens"])
    if tok is not None:  # every id a view may name, so opening the trace reads no file
        loaded.meta["token_strings"] = tok.recorded_strings(loaded.meta.get("tokens") or [])
    loaded.meta.update(
        source={"file": "model_file", "folder": "hf_folder", "config": "hf_config"}[spec.kind],
        model=text,
        device=device,
        input_spec={  # what a re-trace needs to use the same inputs
            "prompt": inputs.prompt,
            "shape": None if inputs.shape is None else list(inputs.shape),
            "dtype": inputs.dtype,
            "seed": inputs.seed,
        },
    )
    if tok is not None:
        loaded.meta["tokenizer"] = str(tok.path.resolve())
    if spec.kind == "file":
        loaded.meta.update(model_file=str(spec.path.resolve()), model_name=spec.name)
    else:
        loaded.meta["model_path"] = str(spec.path.resolve())
    if spec.kind == "config" or (spec.kind == "folder" and device == "meta"):
        loaded.meta["weights"] = "random" if device != "meta" else "none (meta device)"
    loaded.tokenizer = tok
    if spec.kind == "file" and isinstance(getattr(module, spec.name, None), type):
        from tracing.dims.constructor import Constructor  # built with no arguments: its

        # defaults are its sizes, so a knob pass can build it again with one moved
        loaded.rebuild = Constructor.of_defaults(getattr(module, spec.name))
    return loaded


def _tokenized(model: Any, tok: TextTokenizer, prompt: str) -> LoadedModel:
    import torch

    from app.core.user_model import first_embedding_size

    if not prompt:
        raise UserCodeError("the prompt is empty; give some text")
    ids = tok.encode(prompt)
    if not ids:
        raise UserCodeError(f"the prompt {prompt!r} encodes to no tokens")
    vocab = first_embedding_size(model)
    if vocab is not None and max(ids) >= vocab:
        raise UserCodeError(
            f"the tokenizer gives ids up to {max(ids)} but the model's embedding has only "
            f"{vocab} entries: they do not belong together"
        )
    loaded = LoadedModel(model, args=(torch.tensor([ids], dtype=torch.long),))  # (B, T)
    loaded.meta.update(tokens=ids, text=prompt)
    return loaded
