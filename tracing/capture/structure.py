"""What a trace needs to know about a model, made once and cached: the per-model structure.

:class:`_Structure` (weakly keyed by the model) holds the module specs, parameter and
buffer names, the cached forward wrappers, the ``ModuleInfo`` table (:func:`module_infos`)
and the config as JSON (:func:`config_dict`).
"""

from __future__ import annotations

import dataclasses
import json
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from tracing.capture.frames import ModuleSpec
from tracing.capture.op_names import forward_params
from tracing.record import (
    ModuleInfo,
)

_Disable = torch._C.DisableTorchFunction


# --------------------------------------------------------------------------- per model


class _Structure:
    """Everything a trace knows of one model that does not change from one forward pass
    to the next: its modules and their specs, parameter and buffer names, the forward
    wrappers, the :class:`ModuleInfo` table and the config as JSON. Built once per model
    and reused while the same module, parameter and buffer objects stay in place
    (``key``).

    It is the value of a weak-keyed dict whose key is the model, so it never holds the
    model itself (that would keep every traced model alive): only its submodules, ids,
    and the forward wrappers of those submodules. When the model is freed, so is this.
    """

    __slots__ = (
        "buffer_ids", "busy", "calls", "config", "infos", "key", "modules",
        "param_names", "scripts", "specs", "wrappers",
    )  # fmt: skip

    def __init__(self, model: nn.Module, key: tuple):
        self.key = key
        named = list(model.named_modules())
        self.modules = named[1:]  # every submodule with its path; the root is named[0]
        self.param_names: dict[int, str] = {}  # id(parameter or buffer) -> dotted name
        self.buffer_ids: set[int] = set()
        for path, module in reversed(named):  # the first name wins (tied weights)
            prefix = f"{path}." if path else ""
            for name, p in module._parameters.items():
                if p is not None:
                    self.param_names[id(p)] = prefix + name
            for name, b in module._buffers.items():
                if b is not None:
                    self.param_names[id(b)] = prefix + name
                    self.buffer_ids.add(id(b))
        # id(module) -> (path, type name, is torch's own, positional forward parameters)
        self.specs = {id(m): _module_spec(p, m) for p, m in named}
        self.scripts = {id(m) for _, m in named if isinstance(m, torch.jit.ScriptModule)}
        # id(submodule) -> (wrapper, the instance ``forward`` it replaces, the class's)
        self.wrappers: dict[int, tuple[Any, Any, Any]] = {}
        self.calls = list(IDLE_CALLS)  # what the cached wrappers call: a tracer's, or idle
        self.busy = False  # a tracer is using the cached wrappers
        self.infos: dict[str, ModuleInfo] | None = None  # module_infos(), made on first use
        self.config: tuple[Any, dict, dict | None] | None = None  # (config, its attrs, JSON)

    def module_infos(self, model: nn.Module) -> dict[str, ModuleInfo]:
        """:func:`module_infos` of the model (made once: the structure is the same)."""
        if self.infos is None:
            self.infos = module_infos(model, [("", model), *self.modules])
        return dict(self.infos)

    def config_dict(self, config: Any) -> dict | None:
        """:func:`config_dict` of the model's config, kept while its attributes stay the
        same (a shallow comparison); a fresh copy every time."""
        attrs = getattr(config, "__dict__", None)
        if attrs is None or isinstance(config, Mapping):
            return config_dict(config)
        kept = self.config
        if kept is None or kept[0] is not config or kept[1] != attrs:
            kept = self.config = (config, dict(attrs), config_dict(config))
        return _json_copy(kept[2])


def _json_copy(value: Any) -> Any:
    """A deep copy of JSON data (dicts, lists and scalars): ``copy.deepcopy``'s result,
    ten times faster (it has no memo or dispatch to do)."""
    if type(value) is dict:
        return {k: _json_copy(v) if type(v) in (dict, list) else v for k, v in value.items()}
    if type(value) is list:
        return [_json_copy(v) if type(v) in (dict, list) else v for v in value]
    return value


_STRUCTURES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _idle_enter(spec, module, args, kwargs) -> None:
    """What a cached wrapper calls when no trace is running (someone kept it)."""


def _idle_exit(frame, output):
    """What a cached wrapper calls when no trace is running."""
    return output


IDLE_CALLS = (_idle_enter, _idle_exit)


def wrap_forward(spec: ModuleSpec, module: nn.Module, calls: list):
    """A replacement for ``module.forward`` that reports the call's start and end to
    ``calls`` (``[enter, exit]``, swapped per trace), around the original forward."""
    inner = module.forward
    disable = _Disable

    def forward(*args, **kwargs):
        enter, leave = calls
        with disable():  # our own tensor calls must not reach the op mode
            frame = enter(spec, module, args, kwargs)
        output = inner(*args, **kwargs)
        with disable():
            return leave(frame, output)  # the output, or an edit's replacement

    forward.__wrapped__ = inner  # inspect.signature(module.forward) still works
    return forward


def _module_spec(path: str, module: nn.Module) -> ModuleSpec:
    """The module's :class:`ModuleSpec`: path, type name, torch's own, positional parameters."""
    cls = type(module)
    is_torch = cls.__module__.startswith("torch.")
    return ModuleSpec(path, cls.__name__, is_torch, forward_params(module)[0])


def _structure_key(model: nn.Module) -> tuple:
    """Identity of every submodule (with its name), parameter and buffer, cheaply."""
    key: list = []
    append, extend = key.append, key.extend
    todo = [model]
    pop, push = todo.pop, todo.extend
    while todo:
        module = pop()
        if module is None:  # a child slot set to None
            append(None)
            continue
        append(id(module))
        params, buffers, children = module._parameters, module._buffers, module._modules
        if params:
            extend(params)
            extend(map(id, params.values()))
        if buffers:
            append("/")
            extend(buffers)
            extend(map(id, buffers.values()))
        if children:
            append("|")
            extend(children)
            push(children.values())
    return tuple(key)


def structure_of(model: nn.Module) -> _Structure:
    key = _structure_key(model)
    try:
        found = _STRUCTURES.get(model)
    except TypeError:  # pragma: no cover - a module that cannot be weakly referenced
        return _Structure(model, key)
    if found is None or found.key != key:
        found = _STRUCTURES[model] = _Structure(model, key)
    return found


def global_hooks() -> bool:
    """True when global module forward hooks are registered (``register_module_forward_hook``)."""
    hooks = torch.nn.modules.module
    return bool(
        getattr(hooks, "_global_forward_hooks", None)
        or getattr(hooks, "_global_forward_pre_hooks", None)
    )


def module_infos(
    model: nn.Module, named: list[tuple[str, nn.Module]] | None = None
) -> dict[str, ModuleInfo]:
    """A :class:`ModuleInfo` for every module in ``named_modules()``, in order.

    Parameter totals are computed bottom-up from each module's own parameters, counting a
    parameter shared by two modules (tied embeddings) once per subtree.
    """
    if named is None:
        named = list(model.named_modules())
    paths = {id(m): p for p, m in named}
    children_of: dict[str, list[str]] = {}
    subtree: dict[str, dict[int, int]] = {}  # path -> {id(param): numel}
    own: dict[str, int] = {}
    for path, module in named:
        children = []
        for name, child in module._modules.items():
            if child is None:
                continue
            child_path = f"{path}.{name}" if path else name
            if paths.get(id(child)) == child_path:
                children.append(child_path)
        children_of[path] = children
        params = {id(p): p.numel() for p in module._parameters.values() if p is not None}
        own[path] = sum(params.values())
        subtree[path] = params
    for path, _ in reversed(named):  # children come after their parent in named_modules
        merged = subtree[path]
        for child in children_of[path]:
            merged.update(subtree[child])
    infos = {}
    for path, module in named:
        parent = None if not path else (path.rsplit(".", 1)[0] if "." in path else "")
        try:
            extra = module.extra_repr()
        except Exception:  # pragma: no cover - a broken extra_repr is not our problem
            extra = ""
        infos[path] = ModuleInfo(
            path,
            type(module).__name__,
            parent,
            tuple(children_of[path]),
            own[path],
            sum(subtree[path].values()),
            extra,
        )
    return infos


CONFIG_KEPT_CHARS = 2**20
"""Most characters of JSON the config kept in a trace's meta takes (released configs take
a few kB): what is over is left out, named, so every trace written opens again (loading
reads manifests of up to 64 MB)."""

CONFIG_KEPT_DEPTH = 16
"""Deepest nesting of the config kept (real ones nest three or four levels; loading
accepts a meta nested up to 64)."""

_CUT_DEEPER = f"(nested deeper than {CONFIG_KEPT_DEPTH} levels: not kept)"


def config_dict(config: Any) -> dict | None:
    """The model's config as a JSON-able dict (``to_dict()`` or a dataclass), else None;
    bounded by :data:`CONFIG_KEPT_CHARS` and :data:`CONFIG_KEPT_DEPTH`."""
    raw = None
    if config is None:
        return None
    try:
        if hasattr(config, "to_dict"):
            raw = config.to_dict()
        elif dataclasses.is_dataclass(config) and not isinstance(config, type):
            raw = dataclasses.asdict(config)
        elif isinstance(config, Mapping):
            raw = dict(config)
    except Exception:  # a to_dict that raises, a dataclass nested past Python's recursion
        raw = None
    if not isinstance(raw, Mapping):
        return None
    text = json.dumps(_cut_deep(raw, 1), default=str)
    data = json.loads(text)
    return data if len(text) <= CONFIG_KEPT_CHARS else _bounded(data, len(text))


def _cut_deep(value: Any, depth: int) -> Any:
    """``value`` with every object or list deeper than :data:`CONFIG_KEPT_DEPTH` replaced
    by a note, and every key a string (JSON's)."""
    if isinstance(value, Mapping):
        if depth > CONFIG_KEPT_DEPTH:
            return _CUT_DEEPER
        return {str(k): _cut_deep(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if depth > CONFIG_KEPT_DEPTH:
            return _CUT_DEEPER
        return [_cut_deep(v, depth + 1) for v in value]
    return value


def _bounded(data: dict, total: int) -> dict:
    """The first keys of ``data`` (``total`` characters of JSON) that fit in
    :data:`CONFIG_KEPT_CHARS`, with a ``"__cut__"`` note naming how many were left out."""
    kept, used = {}, 0
    for key, value in data.items():
        size = len(json.dumps(key)) + len(json.dumps(value)) + 2  # "key":value,
        if used + size <= CONFIG_KEPT_CHARS - 200:  # room for the note
            kept[key] = value
            used += size
    kept["__cut__"] = (
        f"{len(data) - len(kept)} of the config's {len(data)} keys are not kept: its JSON "
        f"is {total:,} characters, more than the {CONFIG_KEPT_CHARS:,} a trace keeps"
    )
    return kept
