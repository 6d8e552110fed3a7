"""Load a person's own model from a Python file: ``--model FILE.py:NAME``.

``NAME`` is an ``nn.Module`` instance, an ``nn.Module`` subclass that builds with no
arguments, or a function that returns a module. The file is imported with ``importlib``
from its path, its folder first on ``sys.path`` while it imports (so ``from layers import
Block`` beside it works); every import is fresh, so an edited file (and edited modules
beside it) is read again on a re-trace.

Inputs, the first that applies: a prompt as byte tokens, a shape (``long``: random ids
below the first embedding's size; ``float``: ``randn``), or ``example_inputs`` in the file
(a function or a value: a tensor, a tuple of them, or a dict of keyword arguments).

Any failure to import or build becomes one :class:`UserCodeError` naming the file and the
line, with the traceback kept for a dialog. Plain Python, no Qt: the CLI and the app share
it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import linecache
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

DEFAULT_SHAPE = (1, 16)
"""Token ids traced when nothing says which inputs to use (and the model embeds tokens)."""


class UserCodeError(Exception):
    """The user's file could not be imported, or ``NAME`` could not be built.

    ``str(error)`` is one line: ``model.py:12: NameError: name 'F' is not defined``.
    ``details`` is the full traceback, for a dialog.
    """

    def __init__(self, message: str, file: str = "", line: int = 0, details: str = ""):
        super().__init__(message)
        self.file = file
        self.line = line
        self.details = details


@dataclass(frozen=True)
class ModelSpec:
    """``FILE.py:NAME`` parsed: which file, which object in it."""

    file: Path
    name: str

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        path, sep, name = text.rpartition(":")
        if not sep or not path or not name.isidentifier():
            raise UserCodeError(
                f"--model wants FILE.py:NAME (NAME a module, a class or a function in the "
                f"file), got {text!r}"
            )
        return cls(Path(path).expanduser(), name)

    def __str__(self) -> str:
        return f"{self.file}:{self.name}"


@dataclass(frozen=True)
class InputSpec:
    """Which inputs to trace the model on; kept so a re-trace uses the same ones."""

    prompt: str | None = None
    shape: tuple[int, ...] | None = None
    dtype: str = "long"  # "long" or "float", with ``shape``
    seed: int = 0

    @staticmethod
    def parse_shape(text: str) -> tuple[int, ...]:
        try:
            shape = tuple(int(p) for p in text.replace("x", ",").split(",") if p.strip())
        except ValueError:
            shape = ()
        if not shape or any(s <= 0 for s in shape):
            raise UserCodeError(f"--input-shape wants sizes like 2,10; got {text!r}")
        return shape


@dataclass
class LoadedModel:
    """A built model, the inputs to trace it on, and what to put in the trace's meta."""

    model: Any
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    tokenizer: Any = None  # a TextTokenizer (app.core.model_sources) when one came with the model
    rebuild: Any = None  # a class built with no arguments, again with one size moved
    # (tracing.dims.constructor.Constructor: its defaults are its sizes), for the knob passes


# --------------------------------------------------------------------------- import


def import_file(path: Path) -> ModuleType:
    """Import ``path`` as a fresh module (never the cached one), its folder first on
    ``sys.path`` meanwhile. Modules it imported from its own folder on an earlier load
    are dropped first, so edits to them count too."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise UserCodeError(f"no such model file: {path}", str(path))
    folder = str(path.parent)
    _forget_modules_under(folder)
    linecache.checkcache()
    name = f"scratchformer_user.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserCodeError(f"{path} is not a Python file", str(path))
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop(name, None)
        if isinstance(e, KeyboardInterrupt):
            raise
        raise user_code_error(e, path, "importing") from e
    finally:
        with contextlib.suppress(ValueError):  # the file removed it itself
            sys.path.remove(folder)
    return module


def loaded_module(path: str | Path) -> ModuleType | None:
    """The module :func:`import_file` last made of ``path``, or None."""
    if not path:
        return None
    return sys.modules.get(f"scratchformer_user.{Path(path).stem}")


def _forget_modules_under(folder: str) -> None:
    prefix = folder.rstrip("/\\") + "/"
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None) or ""
        if name.startswith("scratchformer_user.") or (file and file.startswith(prefix)):
            sys.modules.pop(name, None)


def user_code_error(error: BaseException, path: Path, doing: str) -> UserCodeError:
    """One line naming the user's file and line (the innermost frame in that file; for a
    SyntaxError, the line it points at), the full traceback as details."""
    details = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    file, line = str(path), 0
    if isinstance(error, SyntaxError) and error.filename:
        file, line = error.filename, error.lineno or 0
    else:
        for frame, lineno in traceback.walk_tb(error.__traceback__):
            name = frame.f_code.co_filename
            if Path(name).resolve() == path or Path(name).parent == path.parent:
                file, line = name, lineno
    where = f"{file}:{line}" if line else file
    detail = f"{type(error).__name__}: {error}".rstrip(": ")
    return UserCodeError(f"{where}: {detail} (while {doing} {path.name})", file, line, details)


# --------------------------------------------------------------------------- build


def build(module: ModuleType, name: str, path: Path) -> Any:
    """The ``nn.Module`` ``NAME`` stands for: an instance, a class built with no
    arguments, or what a function returns."""
    import torch

    if not hasattr(module, name):
        choices = sorted(_candidates(module))
        hint = f"; it defines {', '.join(choices)}" if choices else ""
        raise UserCodeError(f"{path}: no {name!r} in the file{hint}", str(path))
    obj = getattr(module, name)
    if isinstance(obj, torch.nn.Module):
        return obj
    if not callable(obj):
        raise UserCodeError(
            f"{path}: {name} is a {type(obj).__name__}, not a model, a model class or a "
            f"function returning a model",
            str(path),
        )
    try:
        model = obj()
    except TypeError as e:
        if isinstance(obj, type) and "argument" in str(e):
            raise UserCodeError(
                f"{path}: {name}() needs arguments ({e}); give their defaults in __init__, "
                f"or add a function that builds it and name that",
                str(path),
            ) from e
        raise user_code_error(e, path.resolve(), f"building {name} from") from e
    except Exception as e:
        raise user_code_error(e, path.resolve(), f"building {name} from") from e
    if isinstance(model, tuple) and model and isinstance(model[0], torch.nn.Module):
        model = model[0]
    if not isinstance(model, torch.nn.Module):
        raise UserCodeError(
            f"{path}: {name}() returned a {type(model).__name__}, not an nn.Module", str(path)
        )
    return model


def _candidates(module: ModuleType) -> list[str]:
    import torch

    out = []
    for key, value in vars(module).items():
        if key.startswith("_"):
            continue
        is_class = isinstance(value, type) and issubclass(value, torch.nn.Module)
        if isinstance(value, torch.nn.Module) or (is_class and value.__module__ == module.__name__):
            out.append(key)
    return out


# --------------------------------------------------------------------------- inputs


def first_embedding_size(model: Any) -> int | None:
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.Embedding):
            return m.num_embeddings
    return None


def make_inputs(model: Any, module: ModuleType | None, inputs: InputSpec) -> LoadedModel:
    """The arguments to call ``model`` with, and the meta that describes them."""
    import torch

    loaded = LoadedModel(model)
    vocab = first_embedding_size(model)
    if inputs.prompt is not None:
        if not inputs.prompt:
            raise UserCodeError("the prompt is empty; give some text")
        ids = list(inputs.prompt.encode("utf-8"))
        if vocab is not None and max(ids) >= vocab:
            raise UserCodeError(
                f"the prompt's byte tokens go up to {max(ids)} but the model's embedding has "
                f"only {vocab} entries; use --input-shape instead"
            )
        loaded.args = (torch.tensor([ids], dtype=torch.long),)  # (B, T)
        loaded.meta.update(
            tokens=ids,
            text=inputs.prompt,
            token_labels=[bytes([i]).decode("latin-1") for i in ids],
        )
        return loaded
    if inputs.shape is not None or (module is None or not hasattr(module, "example_inputs")):
        shape = inputs.shape or DEFAULT_SHAPE
        if inputs.shape is None and vocab is None:
            raise UserCodeError(
                "no inputs: give --prompt or --input-shape, or define example_inputs in the file"
            )
        generator = torch.Generator().manual_seed(inputs.seed)
        if inputs.dtype == "float":
            loaded.args = (torch.randn(shape, generator=generator),)
        elif inputs.dtype == "long":
            high = vocab or 2
            loaded.args = (torch.randint(0, high, shape, generator=generator),)
            if len(shape) == 2 and shape[0] == 1:
                loaded.meta["tokens"] = loaded.args[0][0].tolist()
        else:
            raise UserCodeError(f"--input-dtype is long or float, got {inputs.dtype!r}")
        loaded.meta["inputs"] = f"{inputs.dtype} {tuple(shape)} (seed {inputs.seed})"
        return loaded
    value = module.example_inputs
    if callable(value):
        try:
            value = value()
        except Exception as e:
            path = Path(module.__file__ or "").resolve()
            raise user_code_error(e, path, "calling example_inputs in") from e
    if isinstance(value, dict):
        loaded.kwargs = dict(value)
    elif isinstance(value, (tuple, list)):
        loaded.args = tuple(value)
    else:
        loaded.args = (value,)
    loaded.meta["inputs"] = "example_inputs"
    return loaded


def load(spec: ModelSpec, inputs: InputSpec = InputSpec()) -> LoadedModel:
    """Import the file, build ``NAME`` in eval mode, make its inputs."""
    module = import_file(spec.file)
    model = build(module, spec.name, spec.file)
    model.eval()
    loaded = make_inputs(model, module, inputs)
    loaded.meta.update(
        source="model_file",
        model_file=str(spec.file.resolve()),
        model_name=spec.name,
        input_spec={  # what a re-trace needs to use the same inputs
            "prompt": inputs.prompt,
            "shape": None if inputs.shape is None else list(inputs.shape),
            "dtype": inputs.dtype,
            "seed": inputs.seed,
        },
    )
    return loaded
