"""Capture one forward pass of any ``nn.Module``: every module call and every tensor op.

Two instruments work together:

- **Module instruments.** Every module in ``named_modules()`` gets its ``forward``
  wrapped for the trace (an instance attribute, removed on exit; see
  :meth:`Tracer._instrument_all`). A module that already has forward hooks (the user's,
  or global ones) gets a forward pre-hook and a forward hook (with kwargs) instead,
  registered after the user's, so its step shows what the hooks made of its inputs and
  output. Entering opens a *module step* (so its index comes before the ops that ran
  inside it) with the inputs named by the forward's parameters (``q``, ``k``, ``mask``);
  leaving closes it with the outputs (``output``, ``output[1]``, ``output['logits']``).
  Wrappers rather than hooks everywhere, because on a small model two hooks per module
  cost several times what a wrapper does (``Module._call_impl``'s slow path, and two
  handles to register and remove per module per trace).
- **A TorchFunctionMode.** Every torch function and tensor method called while a module
  runs (``matmul``, ``transpose``, ``view``, ``softmax``, the residual ``+`` as ``add``,
  ``F.linear`` inside ``nn.Linear``) becomes an *op step*, attributed to the innermost
  running module and to the user source line that called it. While the mode handles a
  call it is popped from torch's mode stack, so a torch function implemented with other
  torch functions is one step, not many.

Tensor identity: the same tensor object passed along keeps one record (weak references,
so a ``shapes`` trace keeps no activation alive); an in-place op bumps ``_version`` and so
makes a new record. The record (``tracing.record``) is built once, at the end.

>>> t = trace(model, tokens, capture="shapes")          # doctest: +SKIP
>>> with Tracer(model, capture="stats") as tracer:      # doctest: +SKIP
...     logits = model(tokens)
>>> tracer.trace.steps[3].label                          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gc
import inspect
import json
import os
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from tracing import dims as dims_mod
from tracing import distributed as distributed_mod
from tracing import trace_file
from tracing.errors import TraceError
from tracing.record import (
    CAPTURE_LEVELS,
    ModuleInfo,
    SourceLocation,
    Step,
    TensorRecord,
    Trace,
)
from tracing.source import caller_location, location_from_traceback
from tracing.stats import StatsCollector
from tracing.trace_file import TraceWriter
from tracing.values import StreamedValues, ValueArena

DEFAULT_VALUE_CAP = 64 * 2**20
"""Bytes: a tensor larger than this (after any ``value_dtype`` downcast) keeps no copy."""

_Tensor = torch.Tensor
_Disable = torch._C.DisableTorchFunction

# --------------------------------------------------------------------------- op names

# Calls that never compute a tensor: skipped before any bookkeeping.
_SKIP_NAMES = frozenset(
    {
        "size", "dim", "numel", "nelement", "ndimension", "item", "tolist", "stride",
        "storage_offset", "data_ptr", "element_size", "is_contiguous", "is_floating_point",
        "is_complex", "is_signed", "get_device", "untyped_storage", "storage",
        "__len__", "__bool__", "__index__", "__int__", "__float__", "__format__",
        "__repr__", "__str__", "__hash__", "__array__", "__reduce_ex__", "__deepcopy__",
        "__iter__", "__contains__", "__dir__", "__getstate__", "__setstate__",
        "has_names", "is_inference", "is_set_to", "_is_view", "__dlpack__",
    }
)  # fmt: skip
# Properties whose value is a tensor but no computation (aliases of the same data).
_SKIP_PROPERTIES = frozenset({"data", "grad", "_base", "_grad", "grad_fn"})

_DTYPE_NAMES = {
    getattr(torch, name): name
    for name in (
        "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8",
        "uint8", "bool", "complex64", "complex128",
    )
}  # fmt: skip

_DEVICE_NAMES: dict[torch.device, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32`` (the record's dtype, without the prefix)."""
    return _DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")


def _device_name(device: torch.device) -> str:
    """``cpu``, ``cuda:0``... (cached: ``str(device)`` builds a new string every call)."""
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = str(device)
    return name


_SKIP = "skip"
# id(model) -> (weakref to it, (module ids, parameter ids), its module infos)
_INFO_CACHE: dict[int, tuple[Any, tuple, dict[str, ModuleInfo]]] = {}
_func_info: dict[Any, str] = {}  # func -> op name, or _SKIP


# --------------------------------------------------------------------------- per model


class _Structure:
    """What a trace needs to know of a model's modules and parameters, built once per model
    and reused while the same module, parameter and buffer objects stay in place.

    It is the value of a weak-keyed dict whose key is the model, so it never holds the
    model itself (that would keep every traced model alive): only its submodules, ids,
    and the forward wrappers of those submodules, reused from one trace to the next.
    """

    __slots__ = (
        "buffer_ids", "busy", "calls", "key", "modules", "param_names", "param_sig",
        "paths", "scripts", "specs", "wrappers",
    )  # fmt: skip

    def __init__(self, model: nn.Module, key: tuple):
        self.key = key
        named = list(model.named_modules())
        self.modules = named[1:]  # every submodule with its path; the root is named[0]
        self.paths = {id(m): p for p, m in named}
        self.param_names: dict[int, str] = {}  # first name wins (tied weights)
        self.buffer_ids: set[int] = set()
        param_ids = []
        for path, module in reversed(named):
            prefix = f"{path}." if path else ""
            for name, p in module._parameters.items():
                if p is not None:
                    self.param_names[id(p)] = prefix + name
                    param_ids.append(id(p))
            for name, b in module._buffers.items():
                if b is not None:
                    self.param_names[id(b)] = prefix + name
                    self.buffer_ids.add(id(b))
        self.param_sig = tuple(param_ids)
        # id(module) -> (path, type name, is torch's own, positional forward parameters)
        self.specs = {id(m): _module_spec(p, m) for p, m in named}
        self.scripts = {id(m) for _, m in named if isinstance(m, torch.jit.ScriptModule)}
        # id(submodule) -> (wrapper, the instance ``forward`` it replaces, the class's)
        self.wrappers: dict[int, tuple[Any, Any, Any]] = {}
        self.calls = list(_IDLE_CALLS)  # what the cached wrappers call: a tracer's, or idle
        self.busy = False  # a tracer is using the cached wrappers


_STRUCTURES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _idle_enter(spec, module, args, kwargs) -> None:
    """What a cached wrapper calls when no trace is running (someone kept it)."""


def _idle_exit(frame, output):
    """What a cached wrapper calls when no trace is running."""
    return output


_IDLE_CALLS = (_idle_enter, _idle_exit)


def _wrap_forward(spec: tuple, module: nn.Module, calls: list):
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


def _module_spec(path: str, module: nn.Module) -> tuple[str, str, bool, tuple[str, ...]]:
    """(path, type name, is one of torch's own modules, positional forward parameters)."""
    cls = type(module)
    return (path, cls.__name__, cls.__module__.startswith("torch."), _forward_params(module)[0])


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


def _structure(model: nn.Module) -> _Structure:
    key = _structure_key(model)
    try:
        found = _STRUCTURES.get(model)
    except TypeError:  # pragma: no cover - a module that cannot be weakly referenced
        return _Structure(model, key)
    if found is None or found.key != key:
        found = _STRUCTURES[model] = _Structure(model, key)
    return found


def _global_hooks() -> bool:
    """True when global module forward hooks are registered (``register_module_forward_hook``)."""
    hooks = torch.nn.modules.module
    return bool(
        getattr(hooks, "_global_forward_hooks", None)
        or getattr(hooks, "_global_forward_pre_hooks", None)
    )


def _op_name(func: Any) -> str:
    """The op name a person expects: ``add`` for ``+``, ``getitem`` for ``x[i]``."""
    name = getattr(func, "__name__", None) or type(func).__name__
    if name == "__get__":  # a property such as ``.T`` or ``.shape``
        owner = getattr(func, "__self__", None)
        prop = getattr(owner, "__name__", "") or "get"
        return _SKIP if prop in _SKIP_PROPERTIES or not prop else prop
    if name in _SKIP_NAMES:
        return _SKIP
    if name.startswith("__") and name.endswith("__") and len(name) > 4:
        core = name[2:-2]
        if core.startswith("i") and core[1:] in _BINARY:
            return _BINARY[core[1:]] + "_"  # x += y is add_
        if core.startswith("r") and core[1:] in _BINARY:
            return _BINARY[core[1:]]
        return _BINARY.get(core, core)
    return name


_BINARY = {
    "add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "div": "div",
    "floordiv": "floor_divide", "mod": "remainder", "pow": "pow", "matmul": "matmul",
    "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor", "lshift": "lshift",
    "rshift": "rshift",
}  # fmt: skip


def _classify(func: Any) -> str:
    try:
        info = _func_info.get(func)
    except TypeError:  # unhashable callable
        return _op_name(func)
    if info is None:
        info = _op_name(func)
        _func_info[func] = info
        if _is_method(func):
            _arg_tables[func] = _METHOD_ARG_NAMES
    return info


def _is_method(func: Any) -> bool:
    """A tensor method (``x.view``, ``x + y``, ``x.shape``) rather than a function the user
    called (``torch.matmul``, ``F.softmax``): its first tensor is ``self``, not ``input``."""
    qualname = getattr(func, "__qualname__", "") or ""
    if qualname.startswith(("TensorBase.", "Tensor.")):
        return True
    return getattr(func, "__name__", "") == "__get__"  # a property of the tensor


_mha_signatures: dict[Any, inspect.Signature] = {}


def _mha_signature(func: Any) -> inspect.Signature:
    found = _mha_signatures.get(func)
    if found is None:
        found = _mha_signatures[func] = inspect.signature(func)
    return found


# --------------------------------------------------------------------------- names


def _arg_names(n: int, first: str = "input") -> tuple[str, ...]:
    """Names of an op's tensor arguments by position: ``input`` (``self`` for a tensor
    method), ``arg1``, ``arg2``..."""
    return (first, *(f"arg{i}" for i in range(1, n)))


_ARG_NAMES = tuple(_arg_names(n) if n else () for n in range(9))
_METHOD_ARG_NAMES = tuple(_arg_names(n, "self") if n else () for n in range(9))
_arg_tables: dict[Any, tuple] = {}  # func -> _METHOD_ARG_NAMES for tensor methods


def _output_names(n: int) -> tuple[str, ...]:
    """Names of an op's ``n`` tensor results: ``output[0]``, ``output[1]``..."""
    return tuple(f"output[{i}]" for i in range(n))


_ONE_OUTPUT = ("output",)
_OUTPUT_NAMES = tuple(_output_names(n) for n in range(9))


_positional_names: dict[type, tuple[tuple[str, ...], bool]] = {}


def _forward_params(module: nn.Module) -> tuple[tuple[str, ...], bool]:
    """Positional parameter names of ``module.forward`` (cached per class)."""
    cls = type(module)
    found = _positional_names.get(cls)
    if found is None:
        names: list[str] = []
        varargs = False
        try:
            sig = inspect.signature(module.forward)
        except (TypeError, ValueError):
            sig = None
        if sig is not None:
            for p in sig.parameters.values():
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                    names.append(p.name)
                elif p.kind == p.VAR_POSITIONAL:
                    varargs = True
                    break
        found = (tuple(names), varargs)
        _positional_names[cls] = found
    return found


def _flatten(obj: Any, name: str, out: list, names: list, depth: int = 0) -> None:
    """Collect the tensors in ``obj`` (nested tuples, lists, dicts) with readable names."""
    if isinstance(obj, _Tensor):
        out.append(obj)
        names.append(name)
    elif depth > 4:
        return
    elif isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            if isinstance(item, _Tensor):
                out.append(item)
                names.append(f"{name}[{i}]")
            elif isinstance(item, (tuple, list, Mapping)):
                _flatten(item, f"{name}[{i}]", out, names, depth + 1)
    elif isinstance(obj, Mapping):
        for key, item in obj.items():
            _flatten(item, f"{name}[{key!r}]", out, names, depth + 1)


# --------------------------------------------------------------------------- the mode


class _OpMode(TorchFunctionMode):
    """Records torch calls made while a traced module runs (popped while it records)."""

    def __init__(self, tracer: Tracer):
        super().__init__()
        self.stack = tracer._stack  # open module calls: no module running, nothing to record
        self.record = _op_recorder(tracer)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # The hottest function of a trace: one dict lookup decides, no kwargs copy.
        try:
            name = _func_info[func]
        except (KeyError, TypeError):  # first call of this func, or an unhashable one
            name = _classify(func)
        if name is _SKIP or not self.stack:
            return func(*args, **kwargs) if kwargs else func(*args)
        return self.record(func, name, args, kwargs)


_SPECIAL_OPS = frozenset(
    {"softmax", "_softmax", "scaled_dot_product_attention", "multi_head_attention_forward"}
    | distributed_mod.FUNCTIONAL_COLLECTIVES  # a functional collective gets its group noted
)


def _op_recorder(tracer: Tracer):
    """The function that records one op call for ``tracer``: ``record(func, name, args,
    kwargs)`` runs the call and returns its result.

    It is the innermost loop of a trace (one call per tensor op), so it is a closure whose
    state sits in cells rather than attributes, and it builds the raw step in one go.
    Inputs are resolved to records before the call, so an in-place op's input is the
    tensor as it was; an input never seen before gets a new record then (rolled back when
    the call turns out to return no tensor, and so makes no step).
    """
    steps = tracer._steps
    stack = tracer._stack
    records = tracer._tensors
    tensor_id = tracer._tensor_id
    param_rids = tracer._param_rids
    param_steps = tracer._param_steps
    shapes_only = tracer._shapes_only
    tables_get = _arg_tables.get
    Tensor, sequences, special = _Tensor, (tuple, list), _SPECIAL_OPS
    default_names, one_output, output_names = _ARG_NAMES, _ONE_OUTPUT, _OUTPUT_NAMES
    edit_names = tracer._edits.op_names if tracer._edits is not None else frozenset()

    def record(func, name, args, kwargs):
        tensors = []
        for a in args:
            if isinstance(a, Tensor):
                tensors.append(a)
            elif isinstance(a, sequences):
                for b in a:
                    if isinstance(b, Tensor):
                        tensors.append(b)
        if kwargs:
            for a in kwargs.values():
                if isinstance(a, Tensor):
                    tensors.append(a)
        known = len(records)
        in_ids = []
        has_param = False
        first_version = 0
        for t in tensors:
            rid = tensor_id(t, None)
            if rid in param_rids:
                has_param = True
            in_ids.append(rid)
        if tensors:
            first_version = tensors[0]._version
        try:
            result = func(*args, **kwargs) if kwargs else func(*args)
        except Exception as e:
            index = tracer._add_op_step(name, func, tensors, in_ids, has_param, (), ())
            steps[index][12] = f"{type(e).__name__}: {e}"
            tracer._failed_step = index
            raise
        if isinstance(result, Tensor):
            outs = (result,)
            out_names = one_output
        else:
            if isinstance(result, sequences):
                outs = tuple([r for r in result if isinstance(r, Tensor)])
            elif result is None and tensors and tensors[0]._version != first_version:
                outs = (tensors[0],)  # x[i] = v: in place, returns None
            else:
                outs = ()
            if not outs:  # not a tensor op (x.shape, torch.equal): no step
                if len(records) != known:
                    tracer._forget_records(known)
                return result
            k = len(outs)
            out_names = output_names[k] if k < len(output_names) else _output_names(k)
        if name in edit_names:  # edits (tracing.edits): a new result, recorded as such
            result, outs = tracer._edit_op(name, result, tensors)
        index = len(steps)
        parent, _, source, path = stack[-1]
        if source is None:
            source = caller_location(2)
        pair = None if shapes_only or not tensors else (tensors[0], in_ids[0])
        # an op that returns its input (contiguous on a contiguous tensor) keeps its id
        out_ids = [tensor_id(t, index, None, pair) for t in outs]
        n = len(tensors)
        try:
            table = tables_get(func, default_names)
        except TypeError:  # unhashable callable
            table = default_names
        names = table[n] if n < len(table) else _arg_names(n, table[1][0] if table[1] else "")
        if has_param:  # parameters are named ("blocks.0.attn.q_proj.weight") in _finish
            param_steps.append(index)
        # (id lists become tuples in _finish, in one warm loop rather than op by op)
        steps.append(
            ["op", path, name, source, in_ids, out_ids, names,
             out_names, len(stack), parent, None, 0, None]
        )  # fmt: skip
        if name in special:
            outs = tracer._attention_op(index, name, func, args, kwargs, outs)
        if tracer._breaker is not None:
            tracer._check_outputs(index, outs)
        return result

    return record


def _module_recorder(tracer: Tracer):
    """The functions that open and close a module step for ``tracer``: ``enter(spec,
    module, args, kwargs) -> frame`` and ``leave(frame, output)``, called by the forward
    wrappers (or hooks) around every module call. Closures, like :func:`_op_recorder`.

    A frame is ``(step index, module, source for its ops or None, path)``: ops inside
    torch's own modules (``nn.Linear``...) take the module step's source line, since every
    frame between is torch code, so their frame walk is skipped.
    """
    steps = tracer._steps
    stack = tracer._stack
    tensor_id = tracer._tensor_id
    calls = tracer._calls
    breaker = tracer._breaker
    edits = tracer._edits
    edit_paths = edits.module_paths if edits is not None else frozenset()
    Tensor, one_output = _Tensor, _ONE_OUTPUT

    def enter(spec, module, args, kwargs):
        path, type_name, torch_module, pos_names = spec
        index = len(steps)
        call = calls.get(path, 0)
        calls[path] = call + 1
        source = caller_location(2)
        # inputs: the common call, tensors by position, needs no flattening
        n = len(args)
        if not kwargs and n <= len(pos_names) and all([isinstance(a, Tensor) for a in args]):
            tensors = args
            names = pos_names[:n]
        else:
            tensors, names = [], []
            for i, arg in enumerate(args):
                _flatten(arg, pos_names[i] if i < len(pos_names) else f"args[{i}]", tensors, names)
            for key, arg in kwargs.items():
                _flatten(arg, key, tensors, names)
            names = tuple(names)
        ids = [tensor_id(t, None) for t in tensors]
        if stack:
            parent, depth = stack[-1][0], len(stack)
        else:
            parent, depth = None, 0
            tracer._root_inputs(ids, names, tensors)
        steps.append(
            ["module", path, type_name, source, ids, (), names, (),
             depth, parent, None, call, None]
        )  # fmt: skip
        frame = (index, module, source if torch_module else None, path)
        stack.append(frame)
        if breaker is not None:
            breaker.enter(tracer._step_record(index))
        return frame

    def leave(frame, output):
        """Close the call's step; returns its output (an edit's replacement, if any)."""
        if stack and stack[-1] is frame:
            stack.pop()
        elif any(f is frame for f in stack):  # calls above it raised; the model caught it
            while stack:
                top = stack.pop()
                if top is frame:
                    break
                step = steps[top[0]]
                step[12] = step[12] or "raised (caught by the model)"
                step[10] = len(steps) - 1
        else:  # a call that started before the trace, or a frame of another tracer
            return output
        index = frame[0]
        step = steps[index]
        step[10] = len(steps) - 1
        if frame[3] in edit_paths:  # edits (tracing.edits) replace the output first
            output = edits.on_module(frame[3], step[11], output, index)
        if isinstance(output, Tensor):
            tensors = (output,)
            step[7] = one_output
        else:
            tensors, names = [], []
            _flatten(output, "output", tensors, names)
            step[7] = tuple(names)
        ids = [tensor_id(t, index) for t in tensors]
        step[5] = ids
        if not stack:
            tracer.output = output
        # attention weights returned by an attention module: (output, weights)
        if (
            len(tensors) >= 2
            and step[7][1] == "output[1]"
            and tensors[1].dim() == 4
            and tracer._is_attention_module(frame[1])
        ):
            tracer._mark_attention(ids[1], tensors[1])
        if breaker is not None:
            tracer._check_outputs(index, tensors)
        return output

    return enter, leave


_NO_KWARGS: dict = {}  # read only: passed as ``**kwargs``, which copies it


# --------------------------------------------------------------------------- tracer


class Tracer:
    """Context manager that records every module call and tensor op of the model's forward.

    >>> with Tracer(model, capture="stats") as tracer:   # doctest: +SKIP
    ...     logits = model(tokens)
    >>> tracer.trace                                      # doctest: +SKIP

    While active, the model runs in eval mode (``train=True`` keeps training mode). On
    exit, whatever happened, every hook handle is removed, the function mode is exited and
    each module's ``training`` flag is restored. If the forward raised, the exception is
    re-raised as :class:`tracing.TraceError` (``from`` the original) whose ``.trace`` holds
    everything recorded up to the failing step.

    Args:
        model: any ``nn.Module``.
        capture: ``"shapes"``, ``"stats"`` or ``"values"``.
        dims: sizes for symbolic axis names, e.g. ``{"B": 1, "T": 12, "C": 64}``; missing
            letters are read from ``model.config`` and the first input's shape.
        value_cap: at ``"values"``, tensors larger than this many bytes keep no copy
            (``None``: every tensor keeps one; with ``out``, memory stays flat anyway).
        value_dtype: at ``"values"``, store floating copies in this dtype (e.g. float16).
        train: trace in training mode (dropout active) instead of eval mode.
        ops: also record tensor ops (not only module calls).
        meta: extra entries for ``trace.meta`` (e.g. ``tokens``, ``text``).
        break_on: breakpoint conditions (``tracing.breakpoints``: ``NonFinite()``,
            ``AbsAbove(1e4)``, ``ModuleIs("blocks.2")``...). The forward stops at the first
            step that meets one; the trace ends there, with ``meta["stopped_at"]``.
        edits: edits applied while the model runs (``tracing.edits``); the trace records
            where each applied in ``meta["edits"]``. An edit that matched nothing raises
            :class:`tracing.edits.EditError`.
        out: write the trace to this file while it records: each kept value goes to the
            file as it is produced (memory stays flat whatever the trace size), the
            header when the trace finishes, and ``trace.values`` then reads lazily from
            the file. An interrupted capture leaves no complete-looking file; a forward
            that raises leaves the partial trace in it.
    """

    def __init__(
        self,
        model: nn.Module,
        capture: str = "stats",
        *,
        dims: Mapping[str, int] | None = None,
        value_cap: int | None = DEFAULT_VALUE_CAP,
        value_dtype: torch.dtype | None = None,
        train: bool = False,
        ops: bool = True,
        meta: Mapping[str, Any] | None = None,
        break_on: Any = None,
        edits: Any = None,
        out: str | os.PathLike | None = None,
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"Tracer needs an nn.Module, got {type(model).__name__}")
        if capture not in CAPTURE_LEVELS:
            raise ValueError(f"capture must be one of {', '.join(CAPTURE_LEVELS)}; got {capture!r}")
        if value_dtype is not None and not isinstance(value_dtype, torch.dtype):
            raise TypeError(f"value_dtype must be a torch.dtype, got {value_dtype!r}")
        self.model = model
        self.capture = capture
        self.dims = dict(dims) if dims else None
        self.value_cap = None if value_cap is None else int(value_cap)
        self.out = None if out is None else Path(out)
        self.value_dtype = value_dtype
        self.train = train
        self.ops = ops
        self.extra_meta = dict(meta) if meta else {}
        self._breaker = None
        if break_on:
            from tracing.breakpoints import LiveBreaker

            self._breaker = LiveBreaker(break_on)
        self._edits = None
        if edits:
            from tracing.edits import EditPlan

            self._edits = EditPlan.of(edits)
            self._edits.check_model(model)
            if self._edits.op_names and not ops:
                raise ValueError("op sites need ops=True: module-only tracing sees no ops")
        self.trace: Trace | None = None
        self.output: Any = None  # the root module's last output, when it returned
        self._active = False
        self._gc_paused = False
        self._holds_cache = False

    # ---- lifecycle

    def __enter__(self) -> Tracer:
        if self._active:
            raise RuntimeError("this Tracer is already active")
        self._reset()
        self._enter_module, self._exit_module = _module_recorder(self)
        model = self.model
        want = self.train
        # remember only the flags we change; model.train() is skipped when none differ
        self._training = [(m, m.training) for _, m in self._named if m.training != want]
        if self._training:
            model.train(want)
        self._handles = []
        self._wrapped = []
        try:
            self._instrument_all()
            # ---- hook: torch.distributed (collectives wrapped for the trace's duration)
            self._ranks = distributed_mod.capture_for(self)
            if self._ranks is not None:
                self._ranks.install()
            if self.ops:
                self._mode = _OpMode(self)
                self._mode.__enter__()
        except BaseException:
            self._cleanup()
            self._sink.abort()
            raise
        # A trace makes thousands of small containers and keeps every one of them: the
        # cyclic collector would scan them again and again for nothing (as ``timeit``
        # does, it is paused while recording; reference counting still frees memory).
        # On exit the young generation is collected once, inside the trace call, so the
        # caller's next allocation does not pay for it unseen (see __exit__).
        self._gc_paused = gc.isenabled()
        gc.disable()
        self._active = True
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            return self._exit(exc, tb)
        finally:
            if self._gc_paused:
                self._gc_paused = False
                gc.enable()
                gc.collect(0)  # the one pass over the trace's new objects, paid here

    def _exit(self, exc: BaseException | None, tb) -> bool:
        self._cleanup()
        self._active = False
        if exc is not None and not isinstance(exc, Exception):
            self._sink.abort()  # interrupted (Ctrl+C, exit): no file that looks complete
        if self._breaker is not None and isinstance(exc, self._breaker.Stop):
            last = len(self._steps) - 1
            for index, *_ in self._stack:  # close the module calls the stop interrupted
                self._steps[index][10] = last
            self._stack.clear()
            self.trace = self._finish(None)
            self.trace.meta["stopped_at"] = exc.hit.to_meta()
            return True  # stopped on purpose: the trace so far, no error
        error = None
        failed_inside = exc is not None and (self._stack or self._failed_step is not None)
        if failed_inside and isinstance(exc, Exception):
            error = self._mark_failure(exc, tb)
        self.trace = self._finish(error)
        if error is not None:
            raise TraceError(error, self.trace) from exc
        if self._edits is not None and exc is None:
            self._edits.check_matched()
        return False

    def _cleanup(self) -> None:
        """Remove every hook, leave the function mode, restore every training flag."""
        for handle in getattr(self, "_handles", ()):
            handle.remove()
        self._handles = []
        for module, previous in getattr(self, "_wrapped", ()):
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.__dict__["forward"] = previous
        self._wrapped = []
        ranks = getattr(self, "_ranks", None)
        if ranks is not None:
            ranks.uninstall()
        if getattr(self, "_holds_cache", False):
            self._holds_cache = False
            self._structure.calls[:] = _IDLE_CALLS  # no reference to this tracer is kept
            self._structure.busy = False
        mode = getattr(self, "_mode", None)
        if mode is not None:
            self._mode = None
            with contextlib.suppress(Exception):  # the mode stack changed under us
                mode.__exit__(None, None, None)
        for module, flag in getattr(self, "_training", ()):
            module.training = flag
        self._training = []

    def _reset(self) -> None:
        # Raw, mutable records; frozen dataclasses are built once in _finish().
        # step: [kind, module, op, source, inputs, outputs, in_names, out_names,
        #        depth, parent, end, call, error]
        self._steps: list[list] = []
        # tensor: [shape, dtype, device, stats, value_key, producer, role, tensor_ref_for_dims]
        self._tensors: list[list] = []
        self._values: dict[str, torch.Tensor] = {}
        self._ids: dict[int, tuple] = {}  # id(tensor) -> (weakref, version, record id)
        structure = self._structure = _structure(self.model)
        self._named = [("", self.model), *structure.modules]
        self._paths = structure.paths
        self._param_names = structure.param_names  # id(parameter or buffer) -> dotted name
        self._param_sig = structure.param_sig
        self._buffer_ids = structure.buffer_ids
        self._specs = structure.specs
        # open module calls, innermost last: frames (see _module_recorder)
        self._stack: list[tuple[int, nn.Module, SourceLocation | None, str]] = []
        self._param_rids: dict[int, str] = {}  # record id -> parameter or buffer name
        self._param_steps: list[int] = []  # op steps with a parameter among their inputs
        self._shapes_only = self.capture == "shapes"
        self._calls: dict[str, int] = {}
        self._failed_step: int | None = None
        self._first_input_shape: tuple[int, ...] | None = None
        self._input_shapes: list[tuple[str, list[int]]] = []
        self._mode = None
        self._skipped_values = 0
        self._attention_types: dict[str, bool] = {}
        self._stats = StatsCollector()
        self._sink = ValueArena() if self.out is None else StreamedValues(TraceWriter(self.out))
        self._ranks: distributed_mod.RankCapture | None = None
        if self._edits is not None:
            self._edits.reset()

    # ---- tensor records

    def _tensor_id(
        self,
        t: torch.Tensor,
        producer: int | None,
        version: int | None = None,
        source: tuple[torch.Tensor, int] | None = None,
    ) -> int:
        """Record id of ``t``: the existing one if this exact tensor was seen unchanged.

        ``source`` is ``(input tensor, its record id)`` for an op's output: when the output
        is a view of that input (``view``, ``transpose``, ``split``, ``x[i]``), its stats
        and kept value are derived from the input's instead of computed again.
        """
        entry = self._ids.get(id(t))
        if version is None:
            version = t._version
        if entry is not None and entry[1] == version and entry[0]() is t:
            return entry[2]
        return self._new_tensor(t, producer, version, source)

    def _new_tensor(
        self,
        t: torch.Tensor,
        producer: int | None,
        version: int,
        source: tuple[torch.Tensor, int] | None = None,
    ) -> int:
        """A new record for ``t`` as it is now (``version`` is its ``_version`` as seen)."""
        key = id(t)
        rid = len(self._tensors)
        # shape stays a torch.Size, dtype and device torch objects: named in _finish
        record = [t.shape, t.dtype, t.device, None, None, producer, None]
        self._tensors.append(record)
        try:  # noqa: SIM105 - try/except costs nothing here; suppress() is a call
            self._ids[key] = (weakref.ref(t), version, rid)
        except TypeError:  # pragma: no cover - tensor subclasses without weakref support
            pass
        if self._ranks is not None:  # ---- hook: a DTensor is recorded as its local shard
            local = self._ranks.local_view(rid, t)
            if local is not None:
                t, source, record[0] = local, None, local.shape
        name = self._param_names.get(key)
        if name is not None:  # a parameter or buffer: no stats, no copy
            record[5] = None
            # a set lookup: isinstance(t, nn.Parameter) runs a Python metaclass check
            record[6] = "buffer" if key in self._buffer_ids else "param"
            self._param_rids[rid] = name
            return rid
        if self._shapes_only or version != t._version:
            return rid
        view = _view_of(t, source[0]) if source is not None and source[0] is not t else None
        if view is not None:
            src = self._tensors[source[1]]
            if view == "all":  # same elements, so the same statistics
                record[3] = src[3]
            copy = None if src[4] is None else self._values.get(src[4])  # None: streamed
            if copy is not None and copy.is_contiguous() and source[0].is_contiguous():
                offset = t.storage_offset() - source[0].storage_offset()
                value = copy.as_strided(t.shape, t.stride(), copy.storage_offset() + offset)
                key_ = f"t{rid}"
                self._values[key_] = value
                record[4] = key_
        if record[3] is None:
            record[3] = self._stats.add(t)  # on an accelerator: pending, no sync
        if self._want_values and record[4] is None:
            self._keep_value(rid, t)
        return rid

    def _module_infos(self) -> dict[str, ModuleInfo]:
        """``module_infos`` of the model, cached while its modules and parameters stay the
        same objects (tracing one model many times pays for it once)."""
        model = self.model
        signature = (tuple(id(m) for _, m in self._named), self._param_sig)
        cached = _INFO_CACHE.get(id(model))
        if cached is not None and cached[0]() is model and cached[1] == signature:
            return dict(cached[2])
        infos = module_infos(model, self._named)
        _INFO_CACHE[id(model)] = (weakref.ref(model), signature, infos)
        return dict(infos)

    def _keep_value(self, rid: int, t: torch.Tensor, force: bool = False) -> None:
        rec = self._tensors[rid]
        if rec[4] is not None:
            return
        dtype = t.dtype
        if self.value_dtype is not None and t.is_floating_point():
            dtype = self.value_dtype
        cap = self.value_cap
        if cap is not None and t.numel() * dtype.itemsize > cap and not force:
            self._skipped_values += 1
            return
        # into the arena or the file; detach() leaves autograd out of the copy
        key, copy = self._sink.keep(f"t{rid}", t, dtype)
        if copy is not None:
            self._values[key] = copy
        rec[4] = key

    def _mark_attention(self, rid: int, t: torch.Tensor) -> None:
        rec = self._tensors[rid]
        if rec[6] is None or rec[6] == "attention":
            rec[6] = "attention"
        self._keep_value(rid, t, force=True)

    @property
    def _want_stats(self) -> bool:
        return self.capture != "shapes"

    @property
    def _want_values(self) -> bool:
        return self.capture == "values"

    # ---- module instruments

    def _instrument_all(self) -> None:
        """Wrap each module's ``forward`` for this trace (an instance attribute, removed on
        exit), or hook it.

        A wrapper is the cheapest way to see a module call begin and end: a module with
        forward hooks takes ``Module._call_impl``'s slow path (a closure and two hook loops
        per call), and registering and removing two hook handles per module costs more
        than a small model's whole forward. The wrappers of submodules are made once per
        model and reused (they call whichever tracer is running).

        A module that already has forward hooks (its own, or global ones) is on that slow
        path anyway, and a wrapper would sit *inside* those hooks: it would record the
        inputs before a user's pre-hook rewrote them and the output before a user's hook
        rewrote it. Such a module gets a pre-hook and a hook of ours instead, registered
        after the user's, so the step shows what the module really received and returned.
        Script modules, whose ``forward`` cannot be replaced, get hooks too.
        """
        structure = self._structure
        specs, scripts = structure.specs, structure.scripts
        if structure.busy:  # another tracer holds the cached wrappers: make our own
            calls, cache = [self._enter_module, self._exit_module], None
        else:
            structure.busy = True
            self._holds_cache = True
            calls = structure.calls
            calls[:] = (self._enter_module, self._exit_module)
            cache = structure.wrappers
        hooked = _global_hooks()
        pre, post = self._pre_hook, self._post_hook
        wrapped = self._wrapped
        for path, module in self._named:
            key = id(module)
            if hooked or module._forward_hooks or module._forward_pre_hooks or key in scripts:
                self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
                self._handles.append(module.register_forward_hook(post, with_kwargs=True))
                continue
            own = module.__dict__
            previous = own.get("forward")
            found = cache.get(key) if cache is not None else None
            if found is not None and found[1] is previous and found[2] is type(module).forward:
                wrapper = found[0]
            else:
                wrapper = _wrap_forward(specs[key], module, calls)
                if cache is not None and path:  # never the root: it would keep it alive
                    cache[key] = (wrapper, previous, type(module).forward)
            wrapped.append((module, previous))
            own["forward"] = wrapper

    def _edit_op(self, name: str, result: Any, inputs: list) -> tuple[Any, tuple]:
        """Apply the edits for op ``name`` in the running module call (``tracing.edits``);
        returns the result and its tensors. An in-place op's tensor is edited in place."""
        index, _, _, path = self._stack[-1]
        call = self._steps[index][11]
        new = self._edits.on_op(path, call, name, result, len(self._steps), inputs)
        if isinstance(new, _Tensor):
            return new, (new,)
        return new, tuple([r for r in new if isinstance(r, _Tensor)])

    def _pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        with _Disable():  # our own tensor calls must not reach the op mode
            self._enter_module(self._specs[id(module)], module, args, kwargs)

    def _post_hook(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        with _Disable():
            for frame in reversed(self._stack):
                if frame[1] is module:
                    new = self._exit_module(frame, output)
                    return None if new is output else new  # an edit replaces the output
        return None

    def _root_inputs(self, ids: list[int], names: tuple, tensors) -> None:
        """The root call's tensors are the trace's inputs (first call: also their shapes)."""
        records = self._tensors
        for rid in ids:
            if records[rid][5] is None and records[rid][6] is None:
                records[rid][6] = "input"
        if self._first_input_shape is None:
            for n, t in zip(names, tensors):
                self._input_shapes.append((n, list(t.shape)))
            if tensors:
                self._first_input_shape = tuple(tensors[0].shape)

    def _is_attention_module(self, module: nn.Module) -> bool:
        """Attention modules by type name: ours, ``nn.MultiheadAttention``, HF ``*Attention``."""
        name = type(module).__name__
        known = self._attention_types.get(name)
        if known is None:
            lowered = name.lower()
            known = "attention" in lowered or "attn" in lowered
            self._attention_types[name] = known
        return known

    # ---- op recording

    def _attention_op(self, index: int, name: str, func, args, kwargs, outs: tuple) -> tuple:
        """Attention maps made by op ``index`` (a softmax in an attention module, a fused
        attention call); returns its outputs with any rebuilt map added. (A functional
        collective also comes here, to have its group noted under torch.distributed.)"""
        if name in distributed_mod.FUNCTIONAL_COLLECTIVES:
            if self._ranks is not None:
                self._ranks.functional(index, func, args, kwargs)
        elif name == "softmax" or name == "_softmax":
            self._maybe_attention_softmax(index, outs[0])
        elif name == "scaled_dot_product_attention":
            outs = (*outs, *self._fused_attention_map(index, args, kwargs))
        elif name == "multi_head_attention_forward":
            outs = (*outs, *self._mha_attention_map(index, func, args, kwargs, outs))
        return outs

    def _fused_attention_map(self, index: int, args: tuple, kwargs: dict) -> tuple:
        """``F.scaled_dot_product_attention`` returns no weights: rebuild them from its
        query, key and mask (``tracing.fused_attention``) and add them to the op's outputs
        as an attention map. Returns the added tensor (none if the call is unusual)."""
        from tracing.fused_attention import weights_from_call

        try:
            weights = weights_from_call(args, kwargs)  # (B, H, T, T)
        except (TypeError, ValueError, RuntimeError):
            return ()
        step = self._steps[index]
        rid = self._tensor_id(weights, index)
        step[5] = (*step[5], rid)
        step[7] = (*step[7], "attention_weights")
        self._mark_attention(rid, weights)
        return (weights,)

    def _mha_attention_map(self, index: int, func, args: tuple, kwargs: dict, outs) -> tuple:
        """``nn.MultiheadAttention`` (``F.multi_head_attention_forward``) returns per-head
        weights only when asked (``need_weights=True, average_attn_weights=False``). When
        they were not returned, compute them once more from the same arguments, asking for
        them, and add them to the op's outputs as an attention map. The model's own result
        is untouched (and dropout is off in the recomputation, so no random numbers are
        drawn). The call receives ``(T, B, C)`` tensors whatever ``batch_first`` says, so
        the weights come back ``(B, H, T, S)``."""
        if len(outs) >= 2 and outs[1].dim() == 4:  # already per head: mark it
            rid = self._steps[index][5][1]
            self._mark_attention(rid, outs[1])
            return ()
        try:
            bound = _mha_signature(func).bind(*args, **kwargs)
            bound.arguments.update(need_weights=True, average_attn_weights=False, training=False)
            _, weights = func(*bound.args, **bound.kwargs)
        except (TypeError, ValueError, RuntimeError):
            return ()
        if not isinstance(weights, _Tensor) or weights.dim() != 4:
            return ()  # unbatched input: (H, T, S) has no batch axis to show
        step = self._steps[index]
        rid = self._tensor_id(weights, index)
        step[5] = (*step[5], rid)
        step[7] = (*step[7], "attention_weights")
        self._mark_attention(rid, weights)
        return (weights,)

    # ---- breakpoints (tracing.breakpoints)

    def _step_record(self, index: int) -> Step:
        s = self._steps[index]
        return Step(
            index=index, kind=s[0], module=s[1], op=s[2], source=s[3], inputs=tuple(s[4]),
            outputs=tuple(s[5]), input_names=self._input_names(s), output_names=s[7],
            depth=s[8], parent=s[9],
            end=s[10], call=s[11], error=s[12],
        )  # fmt: skip

    def _check_outputs(self, index: int, tensors) -> None:
        """Raise the breaker's stop if a condition holds for this step's outputs."""
        records = []
        for rid in self._steps[index][5]:
            shape, dtype, device, stats, key, producer, role = self._tensors[rid][:7]
            record = TensorRecord(
                id=rid, shape=tuple(shape), dtype=_dtype_name(dtype), device=_device_name(device),
                stats=self._stats.resolve(stats),  # a breakpoint pays for its sync
                value_key=key, producer=producer, role=role,
            )  # fmt: skip
            records.append(record)
        self._breaker.exit(self._step_record(index), records, list(tensors))

    def _add_op_step(self, name, func, tensors, in_ids, has_param, out_ids, out_names) -> int:
        """Append an op step (the slow path: an op that raised)."""
        steps = self._steps
        index = len(steps)
        parent, _, source, path = self._stack[-1]
        if source is None:
            source = caller_location(3)
        n = len(tensors)
        try:
            table = _arg_tables.get(func, _ARG_NAMES)
        except TypeError:  # unhashable callable
            table = _ARG_NAMES
        names = table[n] if n < len(table) else _arg_names(n, table[1][0] if table[1] else "")
        if has_param:
            names = tuple([self._param_rids.get(r) or d for r, d in zip(in_ids, names)])
        steps.append(
            ["op", path, name, source, tuple(in_ids), tuple(out_ids), names,
             out_names, len(self._stack), parent, None, 0, None]
        )  # fmt: skip
        return index

    def _record_external_op(self, name, run, ins, in_names, outs, out_names, settled=True):
        """Run ``run()`` and record it as op ``name``: a call the function mode cannot see
        (a ``torch.distributed`` collective, see ``tracing.distributed``). ``ins`` are read
        before it runs, ``outs`` (tensors it writes into; a list may be filled by ``run``)
        after; unsettled outputs (an async collective) keep their shape only. Returns
        ``(step index, result)``, the index None outside the traced forward."""
        if not self._stack:
            return None, run()
        with _Disable():  # reading a tensor runs torch ops the mode must not record
            in_ids = [self._tensor_id(t, None) for t in ins]
        source = caller_location(1)
        parent, _, _, path = self._stack[-1]
        row = ["op", path, name, source, in_ids, [], tuple(in_names),
               tuple(out_names), len(self._stack), parent, None, 0, None]  # fmt: skip
        try:
            result = run()
        except Exception as e:
            row[12] = f"{type(e).__name__}: {e}"
            self._failed_step = len(self._steps)
            self._steps.append(row)
            raise
        index = len(self._steps)
        self._steps.append(row)
        # always new records: a collective writes in place, sometimes keeping _version
        with _Disable():
            row[5] = [self._new_tensor(t, index, t._version if settled else -1) for t in outs]
        if in_ids and any(r in self._param_rids for r in in_ids):
            self._param_steps.append(index)
        return index, result

    def _input_names(self, step: list) -> tuple[str, ...]:
        """An op's input names with each parameter or buffer named by its path."""
        names, rids = step[6], self._param_rids
        if step[0] != "op" or rids.keys().isdisjoint(step[4]):
            return names
        return tuple([rids.get(r) or d for r, d in zip(step[4], names)])

    def _forget_records(self, first: int) -> None:
        """Drop the records from ``first`` on (made for an op that made no step)."""
        del self._tensors[first:]
        for key in [k for k, entry in self._ids.items() if entry[2] >= first]:
            del self._ids[key]
        for rid in [r for r in self._param_rids if r >= first]:
            del self._param_rids[rid]
        for key in [k for k in self._values if int(k[1:]) >= first]:
            del self._values[key]
        if self._ranks is not None:
            self._ranks.forget(first)

    def _maybe_attention_softmax(self, index: int, out: torch.Tensor) -> None:
        """A softmax producing (B, H, T, T) inside an attention module is an attention map."""
        if out.dim() != 4:
            return
        _, module, _, path = self._stack[-1]
        tname = type(module).__name__.lower()
        leaf = path.rsplit(".", 1)[-1].lower()
        if "attention" in tname or "attn" in tname or "attn" in leaf or "attention" in leaf:
            rid = self._steps[index][5][0]
            self._mark_attention(rid, out)

    # ---- failure

    def _mark_failure(self, exc: BaseException, tb) -> str:
        """Set ``error`` on the failing step and every enclosing module step; return msg."""
        detail = f"{type(exc).__name__}: {exc}"
        last = len(self._steps) - 1
        failed = self._failed_step
        if failed is None and self._stack:
            failed = self._stack[-1][0]
        for index, *_ in self._stack:
            self._steps[index][12] = self._steps[index][12] or detail
            self._steps[index][10] = last
        if failed is None:  # pragma: no cover - nothing ran
            return f"forward pass failed: {detail}"
        step = self._steps[failed]
        step[12] = step[12] or detail
        source: SourceLocation | None = step[3]
        if step[0] == "module":
            source = location_from_traceback(tb) or source
        where = f"{step[1] or '<root>'} · {step[2]}"
        at = ""
        if source is not None:
            at = f" at {source.file}:{source.line}"
            if source.text:
                at += f" `{source.text}`"
        self._stack.clear()
        return f"forward pass failed in {where}{at}: {detail}"

    # ---- building the record

    def _finish(self, error: str | None) -> Trace:
        model = self.model
        config = getattr(model, "config", None)
        sizes = dims_mod.resolve_sizes(self.dims, config, self._first_input_shape)
        namer = dims_mod.namer_for(sizes)
        raw_steps = self._steps
        param_paths = self._param_rids
        rows = []
        append = rows.append
        named = namer.named_cache()  # (shape, context) -> dims, filled by namer() calls
        unseen = dims_mod.UNSEEN
        dtypes, devices = _DTYPE_NAMES, _DEVICE_NAMES
        self._stats.finish()  # every statistic still on a device comes back at once
        resolve = self._stats.resolve
        for rid, (size, dtype, device, stats, key, producer, role) in enumerate(self._tensors):
            stats = resolve(stats)
            shape = tuple(size)
            dtype = dtypes.get(dtype) or _dtype_name(dtype)
            device = devices.get(device) or _device_name(device)
            # the module a tensor came from breaks ties between equal sizes (F == V)
            context = param_paths.get(rid, "") if producer is None else raw_steps[producer][1]
            dims = named.get((shape, context), unseen)
            if dims is unseen:
                dims = namer(shape, context)
            if role == "attention" and dims is not None and len(dims) == 4:
                dims = ("B", "H", "T", "T") if dims[:2] == ("B", "H") else dims
            append((rid, shape, dtype, device, dims, stats, key, producer, role))
        tensors = _build_tensor_records(rows)
        for index in self._param_steps:
            step = raw_steps[index]
            step[6] = self._input_names(step)
        steps = _build_steps(raw_steps)
        meta = {
            "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
            "config": config_dict(config),
            "capture": self.capture,
            "torch_version": torch.__version__,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "dims": sizes,
            "input_shapes": dict(self._input_shapes),
            "training": self.train,
            "capture_seconds": round(time.perf_counter() - self._t0, 6),
        }
        if self.capture == "values":
            meta["value_cap"] = self.value_cap
            meta["value_dtype"] = None if self.value_dtype is None else str(self.value_dtype)[6:]
            meta["values_skipped"] = self._skipped_values
        if self._ranks is not None:
            meta.update(self._ranks.meta())
        if self._edits is not None:
            meta["edits"] = self._edits.to_meta()
        meta.update(self.extra_meta)
        self._sink.finish()  # copies from a device: waited for once, here
        trace = Trace(
            steps=steps,
            modules=self._module_infos(),
            tensors=tensors,
            meta=meta,
            values=self._values,
            error=error,
        )
        if self.out is not None and not self._sink.aborted:
            self._sink.writer.close(trace)  # the header, then the file takes its name
            trace.values = trace_file.load(self.out).values
        return trace


# --------------------------------------------------------------------------- helpers


def _spec(cls) -> tuple[tuple[str, ...], dict[str, Any]]:
    fields = dataclasses.fields(cls)
    defaults = {}
    for f in fields:
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory
    return tuple(f.name for f in fields), defaults


_STEP_FIELDS = _spec(Step)
_TENSOR_FIELDS = _spec(TensorRecord)
_MODULE_FIELDS = _spec(ModuleInfo)


def _build(cls, spec: tuple[tuple[str, ...], dict[str, Any]], values: tuple):
    """Build a frozen record without its ``__init__`` (5x faster for thousands of steps).

    ``values`` fill the first fields in order; any later field (one added to the record
    contract after this was written) gets its declared default.
    """
    fields, defaults = spec
    obj = object.__new__(cls)
    d = obj.__dict__
    for name in fields[len(values) :]:
        default = defaults[name]
        d[name] = default() if callable(default) else default
    d.update(zip(fields, values))
    return obj


def _bulk_builder(cls, count: int, indexed: bool = False, tuples: tuple[str, ...] = ()):
    """A function ``build_all(rows)`` turning rows of values into frozen ``cls`` records,
    without running their ``__init__``: each row fills the first ``count`` fields in order
    (any later field, one added to the record contract since, gets its declared default).
    With ``indexed``, the first field is the row's position and rows hold the rest. The
    fields named in ``tuples`` are made tuples (rows may hold lists there).

    One loop, one dict literal per record, no call per record: a trace builds thousands.
    """
    fields, defaults = _spec(cls)
    names = [f"v{i}" for i in range(count)]
    items = [
        f"{name!r}: tuple(v{i})" if name in tuples else f"{name!r}: v{i}"
        for i, name in enumerate(fields[:count])
    ]
    for name in fields[count:]:
        call = "()" if callable(defaults[name]) else ""
        items.append(f"{name!r}: defaults[{name!r}]{call}")
    if indexed:
        loop = f"for v0, ({', '.join(names[1:])},) in enumerate(rows):"
    else:
        loop = f"for {', '.join(names)} in rows:"
    source = (
        "def build_all(rows):\n"
        "    out = []\n"
        "    append = out.append\n"
        f"    {loop}\n"
        "        obj = new(cls)\n"
        f"        set_dict(obj, '__dict__', {{{', '.join(items)}}})\n"
        "        append(obj)\n"
        "    return out\n"
    )
    namespace = {"new": object.__new__, "cls": cls, "set_dict": object.__setattr__}
    namespace["defaults"] = defaults
    exec(source, namespace)  # generated from dataclass field names only
    return namespace["build_all"]


_build_steps = _bulk_builder(Step, 14, indexed=True, tuples=("inputs", "outputs"))
_build_tensor_records = _bulk_builder(TensorRecord, 9)


def _view_of(t: torch.Tensor, src: torch.Tensor) -> str | None:
    """``"all"`` if ``t`` views exactly the elements of ``src``, ``"part"`` if a subset of
    them, ``None`` if it is not a view into ``src``'s elements (or ``src`` is strided).
    """
    if t.dtype != src.dtype or not src.is_contiguous():
        return None
    base = t._base
    if base is None or (base is not src and base is not src._base):
        return None
    low = t.storage_offset()
    high = low
    for size, stride in zip(t.shape, t.stride()):
        if size == 0:
            return None
        if stride < 0:
            return None
        high += (size - 1) * stride
    start = src.storage_offset()
    if low < start or high >= start + src.numel():
        return None
    if t.numel() == src.numel() and 0 not in t.stride():
        return "all"
    return "part"


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
        infos[path] = _build(
            ModuleInfo,
            _MODULE_FIELDS,
            (
                path,
                type(module).__name__,
                parent,
                tuple(children_of[path]),
                own[path],
                sum(subtree[path].values()),
                extra,
            ),
        )
    return infos


_CONFIG_CACHE: dict[int, tuple[Any, dict, dict | None]] = {}


def config_dict(config: Any) -> dict | None:
    """The model's config as a JSON-able dict (``to_dict()`` or a dataclass), else None.

    Cached per config object while its attributes stay the same (a shallow comparison).
    """
    if config is None:
        return None
    attrs = getattr(config, "__dict__", None)
    if attrs is None or isinstance(config, Mapping):
        return _config_dict(config)
    cached = _CONFIG_CACHE.get(id(config))
    if cached is not None and cached[0]() is config and cached[1] == attrs:
        return copy.deepcopy(cached[2])
    result = _config_dict(config)
    try:
        ref = weakref.ref(config)
    except TypeError:
        return result
    if len(_CONFIG_CACHE) > 64:
        _CONFIG_CACHE.clear()
    _CONFIG_CACHE[id(config)] = (ref, dict(attrs), copy.deepcopy(result))
    return result


def _config_dict(config: Any) -> dict | None:
    raw = None
    if hasattr(config, "to_dict"):
        try:
            raw = config.to_dict()
        except Exception:
            raw = None
    elif dataclasses.is_dataclass(config) and not isinstance(config, type):
        raw = dataclasses.asdict(config)
    elif isinstance(config, Mapping):
        raw = dict(config)
    if raw is None:
        return None
    return json.loads(json.dumps(raw, default=str))


def trace(
    model: nn.Module,
    *args: Any,
    capture: str = "stats",
    dims: Mapping[str, int] | None = None,
    value_cap: int = DEFAULT_VALUE_CAP,
    value_dtype: torch.dtype | None = None,
    train: bool = False,
    grad: bool = False,
    ops: bool = True,
    meta: Mapping[str, Any] | None = None,
    break_on: Any = None,
    out: str | os.PathLike | None = None,
    edits: Any = None,
    **kwargs: Any,
) -> Trace:
    """Run ``model(*args, **kwargs)`` once and return everything it did as a :class:`Trace`.

    Runs in eval mode and without autograd (``train=True`` / ``grad=True`` to change
    that). If the forward raises, :class:`tracing.TraceError` is raised ``from`` the
    original exception, with the partial trace as ``.trace``. With ``break_on``, it stops
    at the first step that meets a condition and returns the trace up to there, with
    ``meta["stopped_at"]``. With ``edits`` (``tracing.edits``), values are changed as the
    model runs and ``meta["edits"]`` says where. With ``out``, the trace is written to that
    file as it records (values streamed, memory flat; a partial trace too) and its values
    are read from it; under ``torch.distributed`` each rank writes its own file
    (``out=trace.sft`` -> ``trace.rank0.sft``, ``trace.rank1.sft``...). See
    :class:`Tracer` for the rest.
    """
    if out is not None:
        out = distributed_mod.output_path(out)
    tracer = Tracer(
        model, capture, dims=dims, value_cap=value_cap, value_dtype=value_dtype,
        train=train, ops=ops, meta=meta, break_on=break_on, edits=edits, out=out,
    )  # fmt: skip
    with torch.set_grad_enabled(grad), tracer:
        model(*args, **kwargs)
    assert tracer.trace is not None
    return tracer.trace


__all__ = ["DEFAULT_VALUE_CAP", "Tracer", "module_infos", "trace"]
