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
makes a new record.

How a trace is built, top to bottom in this file:

1. **Per model** (:class:`_Structure`, weakly keyed by the model): module specs, parameter
   and buffer names, which modules are attention, the cached forward wrappers, the
   ``ModuleInfo`` table and the config as JSON. Made once, freed with the model.
2. **Drafts** (:class:`_StepDraft`, :class:`_TensorDraft`): mutable steps and tensor
   records with ``Step``'s and ``TensorRecord``'s field names, filled while the forward
   runs; ``freeze()`` makes the frozen record, once, in :meth:`Tracer._finish`.
3. **Recorders** (:func:`_op_recorder`, :func:`_module_recorder`): the closures the op
   mode and the forward wrappers call on every op and module call.
4. **The Tracer**: lifecycle (enter, exit, cleanup), then tensor records, instruments,
   attention maps, breakpoints, failure, and :meth:`Tracer._finish`.

Extension points (methods of :class:`Tracer`; keep new behaviour there, not in the
recorders):

- :meth:`Tracer._op_done` sees every op's tensor outputs once its step holds their ids;
- :meth:`Tracer._module_done` sees every module call's output tensors, likewise;
- :meth:`Tracer._op_failed` makes the step of an op that raised;
- :meth:`Tracer._edit_op` replaces an op's result (``tracing.edits``; module outputs are
  replaced in ``leave`` of :func:`_module_recorder`);
- :meth:`Tracer._record_external_op` records a call the mode cannot see (a collective);
- :meth:`Tracer._new_tensor` makes every tensor record (stats, kept value);
- :meth:`Tracer._store_value` is the one place a kept copy enters ``trace.values``;
- :meth:`Tracer._finish` assembles the :class:`Trace` and its ``meta``.

>>> t = trace(model, tokens, capture="shapes")          # doctest: +SKIP
>>> with Tracer(model, capture="stats") as tracer:      # doctest: +SKIP
...     logits = model(tokens)
>>> tracer.trace.steps[3].label                          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import inspect
import json
import os
import threading
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
from tracing.dim_flow import refine_dims
from tracing.dim_names import Subject, name_axes
from tracing.errors import TraceError
from tracing.postmortem import embed_sources, failure_of
from tracing.record import (
    CAPTURE_LEVELS,
    Failure,
    ModuleInfo,
    SourceLocation,
    Step,
    TensorRecord,
    Trace,
    built,
)
from tracing.source import caller_location, location_from_traceback
from tracing.stats import StatsCollector, resolve_stats
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


_UNSUPPORTED = (RuntimeError, NotImplementedError, TypeError, ValueError)
"""What computing stats or a copy raises for a tensor kind that has no data or no dense
form here (meta, sparse, masked, some subclasses): those are recorded by shape."""


def _tensor_kind(t: torch.Tensor) -> str:
    """A short name for a tensor's kind, for notes: ``meta``, ``sparse_coo``, a subclass."""
    if type(t) not in (torch.Tensor, nn.Parameter):
        return type(t).__name__
    if t.is_meta:
        return "meta"
    if t.layout != torch.strided:
        return str(t.layout).removeprefix("torch.")
    return f"{_dtype_name(t.dtype)} on {t.device.type}"


def _force_eager(named: list) -> Any:
    """For a model with ``torch.compile``d parts (``OptimizedModule``), an entered context
    that runs them eagerly until exited (compiled code runs ops the function mode cannot
    follow, and fails inside it); None for any other model."""
    if not any(type(m).__name__ == "OptimizedModule" for _, m in named):
        return None
    stance = torch.compiler.set_stance("force_eager")
    stance.__enter__()
    return stance


def _device_name(device: torch.device) -> str:
    """``cpu``, ``cuda:0``... (cached: ``str(device)`` builds a new string every call)."""
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = str(device)
    return name


_SKIP = "skip"
_func_info: dict[Any, str] = {}  # func -> op name, or _SKIP


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


# --------------------------------------------------------------------------- per model


class _Structure:
    """Everything a trace knows of one model that does not change from one forward pass
    to the next: its modules and their specs, parameter and buffer names, which modules
    are attention, the forward wrappers, the :class:`ModuleInfo` table and the config as
    JSON. Built once per model and reused while the same module, parameter and buffer
    objects stay in place (``key``).

    It is the value of a weak-keyed dict whose key is the model, so it never holds the
    model itself (that would keep every traced model alive): only its submodules, ids,
    and the forward wrappers of those submodules. When the model is freed, so is this.
    """

    __slots__ = (
        "attention", "buffer_ids", "busy", "calls", "config", "infos", "key", "modules",
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
        self.attention = {id(m) for p, m in named if _looks_like_attention(p, m)}
        self.scripts = {id(m) for _, m in named if isinstance(m, torch.jit.ScriptModule)}
        # id(submodule) -> (wrapper, the instance ``forward`` it replaces, the class's)
        self.wrappers: dict[int, tuple[Any, Any, Any]] = {}
        self.calls = list(_IDLE_CALLS)  # what the cached wrappers call: a tracer's, or idle
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


def _looks_like_attention(path: str, module: nn.Module) -> bool:
    """The one attention heuristic: ``attention`` or ``attn`` in the module's type name
    (ours, ``nn.MultiheadAttention``, Hugging Face ``*Attention``) or in its own name.
    A softmax made inside such a module, or a 4-d second output it returns, is an
    attention map."""
    names = (type(module).__name__.lower(), path.rsplit(".", 1)[-1].lower())
    return any("attention" in n or "attn" in n for n in names)


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


# --------------------------------------------------------------------------- names


def _arg_names(n: int, first: str = "input") -> tuple[str, ...]:
    """Names of an op's tensor arguments by position: ``input`` (``self`` for a tensor
    method), ``arg1``, ``arg2``..."""
    return (first, *(f"arg{i}" for i in range(1, n)))


_ARG_NAMES = tuple(_arg_names(n) if n else () for n in range(9))
_METHOD_ARG_NAMES = tuple(_arg_names(n, "self") if n else () for n in range(9))
_arg_tables: dict[Any, tuple] = {}  # func -> _METHOD_ARG_NAMES for tensor methods


def _op_input_names(func: Any, n: int) -> tuple[str, ...]:
    """Names of the ``n`` tensor arguments of a call of ``func`` (see :func:`_arg_names`)."""
    try:
        table = _arg_tables.get(func, _ARG_NAMES)
    except TypeError:  # unhashable callable
        table = _ARG_NAMES
    return table[n] if n < len(table) else _arg_names(n, table[1][0])


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


# --------------------------------------------------------------------------- drafts


class _StepDraft:
    """A step under construction: :class:`Step`'s fields, mutable (its outputs, end and
    error are known later than the rest). :meth:`seal` turns the draft itself into the
    record when the trace finishes; :meth:`freeze` makes a copy mid-run (a breakpoint's).

    No ``__slots__``: a draft has a ``__dict__`` like a ``Step``, so sealing only sets the
    last fields and the class (a record costs no second object and no copy of fields).
    """

    def __init__(
        self, kind, module, op, source, inputs, outputs, input_names, output_names, depth,
        parent, call=0,
    ):  # fmt: skip
        self.kind = kind  # "module" or "op"
        self.module = module  # dotted path it ran in
        self.op = op  # op name, or the module's type name
        self.source = source
        self.inputs = inputs  # record ids (a list while recording)
        self.outputs = outputs
        self.input_names = input_names
        self.output_names = output_names
        self.depth = depth
        self.parent = parent
        self.end = None  # module steps: the last step inside the call, set on leaving
        self.call = call
        self.error = None

    def seal(self, index: int) -> Step:
        """This draft, now the frozen :class:`Step` at ``index`` (the draft is done)."""
        self.index = index
        self.inputs = tuple(self.inputs)
        self.outputs = tuple(self.outputs)
        self.forward = None
        self.__class__ = Step  # same layout (a plain __dict__): the fields are Step's
        return self  # type: ignore[return-value]

    def freeze(self, index: int, input_names: tuple[str, ...] | None = None) -> Step:
        return built(  # Step(...), 2.5x faster
            Step,
            {
                "index": index, "kind": self.kind, "module": self.module, "op": self.op,
                "source": self.source, "inputs": tuple(self.inputs),
                "outputs": tuple(self.outputs),
                "input_names": self.input_names if input_names is None else input_names,
                "output_names": self.output_names, "depth": self.depth,
                "parent": self.parent, "end": self.end, "call": self.call,
                "error": self.error, "forward": None,
            },
        )  # fmt: skip


class _TensorDraft:
    """A tensor record under construction: the torch ``Size``, dtype and device as seen
    (named only when it becomes the record: :meth:`seal`, or :meth:`freeze` for a copy
    mid-run), the stats, the key of its kept value, the step that produced it and its role
    (``param``, ``input``, ``attention``...)."""

    def __init__(self, shape, dtype, device, producer):
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.stats = None
        self.value_key = None
        self.producer = producer
        self.role = None

    def seal(self, rid: int, dims, shape: tuple[int, ...]) -> TensorRecord:
        """This draft, now the frozen :class:`TensorRecord` ``rid`` (see
        :meth:`_StepDraft.seal`)."""
        self.id = rid
        self.shape = shape
        self.dtype = _dtype_name(self.dtype)
        self.device = _device_name(self.device)
        self.dims = dims
        self.stats = resolve_stats(self.stats)
        self.grad_of = None
        self.__class__ = TensorRecord
        return self  # type: ignore[return-value]

    def freeze(self, rid: int, dims=None, shape: tuple[int, ...] | None = None) -> TensorRecord:
        return built(  # TensorRecord(...), 2.5x faster
            TensorRecord,
            {
                "id": rid, "shape": tuple(self.shape) if shape is None else shape,
                "dtype": _dtype_name(self.dtype), "device": _device_name(self.device),
                "dims": dims, "stats": resolve_stats(self.stats),
                "value_key": self.value_key, "producer": self.producer, "role": self.role,
                "grad_of": None,
            },
        )  # fmt: skip


# --------------------------------------------------------------------------- the recorders


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


# Ops whose outputs may be (or may come with) an attention map: see Tracer._attention_op.
_ATTENTION_OPS = frozenset(
    {"softmax", "_softmax", "scaled_dot_product_attention", "multi_head_attention_forward"}
)
_COLLECTIVE_OPS = distributed_mod.FUNCTIONAL_COLLECTIVES  # their group is noted
_NOTED_OPS = _ATTENTION_OPS | _COLLECTIVE_OPS  # ops that _op_done looks at more closely


def _tensor_args(args: tuple, kwargs: dict | None) -> list[torch.Tensor]:
    """An op's tensor arguments in order: positional ones (and tensors in a list or tuple
    argument, as ``torch.cat`` takes them), then keyword ones."""
    tensors = []
    for a in args:
        if isinstance(a, _Tensor):
            tensors.append(a)
        elif isinstance(a, (tuple, list)):
            for b in a:
                if isinstance(b, _Tensor):
                    tensors.append(b)
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, _Tensor):
                tensors.append(a)
    return tensors


def _tensor_results(result: Any, tensors: list, version: int) -> tuple[tuple, tuple]:
    """An op's tensor results and their names. ``version`` is the first input's
    ``_version`` before the call: ``x[i] = v`` returns None but changed ``x``, so ``x`` is
    its result. No tensor result (``x.shape``, ``torch.equal``) gives ``((), ())``."""
    if isinstance(result, _Tensor):
        return (result,), _ONE_OUTPUT
    if isinstance(result, (tuple, list)):
        outs = tuple([r for r in result if isinstance(r, _Tensor)])
    elif result is None and tensors and tensors[0]._version != version:
        outs = (tensors[0],)
    else:
        return (), ()
    n = len(outs)
    return outs, _OUTPUT_NAMES[n] if n < len(_OUTPUT_NAMES) else _output_names(n)


def _op_recorder(tracer: Tracer):
    """The function that records one op call for ``tracer``: ``record(func, name, args,
    kwargs)`` runs the call and returns its result.

    It runs once per tensor op, so it is a closure whose state sits in cells rather than
    attributes. Inputs are resolved to records before the call, so an in-place op's input
    is the tensor as it was; an input never seen before gets a new record then (rolled
    back when the call turns out to return no tensor, and so makes no step).
    """
    records, tensor_id = tracer._tensors, tracer._tensor_id
    open_op, op_done = tracer._open_op, tracer._op_done
    shapes_only = tracer._shapes_only
    edit_names = tracer._edits.op_names if tracer._edits is not None else frozenset()

    def record(func, name, args, kwargs):
        tensors = _tensor_args(args, kwargs)
        known = len(records)
        in_ids = [tensor_id(t, None) for t in tensors]
        version = tensors[0]._version if tensors else 0
        try:
            result = func(*args, **kwargs) if kwargs else func(*args)
        except Exception as e:
            tracer._op_failed(func, name, in_ids, e)
            raise
        outs, out_names = _tensor_results(result, tensors, version)
        if not outs:  # not a tensor op: no step
            if len(records) != known:
                tracer._forget_records(known)
            return result
        if name in edit_names:  # edits (tracing.edits): a new result, recorded as such
            result, outs = tracer._edit_op(name, result, tensors)
        index, step = open_op(func, name, in_ids, out_names)
        # an op that returns its input (contiguous on a contiguous tensor) keeps its id
        pair = None if shapes_only or not tensors else (tensors[0], in_ids[0])
        step.outputs = [tensor_id(t, index, None, pair) for t in outs]
        op_done(index, name, func, args, kwargs, outs)
        return result

    return record


def _module_inputs(spec: tuple, args: tuple, kwargs: dict) -> tuple[Any, tuple[str, ...]]:
    """A module call's input tensors and their names: by the forward's parameter names
    (``q``, ``k``, ``mask``), ``args[i]`` past them, keyword names, ``x[0]`` inside a
    list or dict."""
    pos_names = spec[3]
    n = len(args)
    if not kwargs and n <= len(pos_names) and all([isinstance(a, _Tensor) for a in args]):
        return args, pos_names[:n]  # the common call, tensors by position
    tensors: list = []
    names: list = []
    for i, arg in enumerate(args):
        _flatten(arg, pos_names[i] if i < len(pos_names) else f"args[{i}]", tensors, names)
    for key, arg in kwargs.items():
        _flatten(arg, key, tensors, names)
    return tensors, tuple(names)


def _module_outputs(output: Any) -> tuple[Any, tuple[str, ...]]:
    """A module's output tensors and their names: ``output``, ``output[1]``,
    ``output['logits']``."""
    if isinstance(output, _Tensor):
        return (output,), _ONE_OUTPUT
    tensors: list = []
    names: list = []
    _flatten(output, "output", tensors, names)
    return tensors, tuple(names)


def _module_recorder(tracer: Tracer):
    """The functions that open and close a module step for ``tracer``: ``enter(spec,
    module, args, kwargs) -> frame`` and ``leave(frame, output)``, called by the forward
    wrappers (or hooks) around every module call. Closures, like :func:`_op_recorder`.

    A frame is ``(step index, module, source for its ops or None, path)``: ops inside
    torch's own modules (``nn.Linear``...) take the module step's source line, since every
    frame between is torch code, so their frame walk is skipped.
    """
    steps, stack, calls = tracer._steps, tracer._stack, tracer._calls
    tensor_id = tracer._tensor_id
    breaker = tracer._breaker
    edits = tracer._edits
    edit_paths = edits.module_paths if edits is not None else frozenset()
    owner, get_ident = tracer._thread, threading.get_ident

    def enter(spec, module, args, kwargs):
        if get_ident() != owner:  # another thread calling the model: not this trace's
            return None
        path, type_name, torch_module, _ = spec
        index = len(steps)
        call = calls.get(path, 0)
        calls[path] = call + 1
        source = caller_location(2)
        tensors, names = _module_inputs(spec, args, kwargs)
        ids = [tensor_id(t, None) for t in tensors]
        if stack:
            parent, depth = stack[-1][0], len(stack)
        else:
            parent, depth = None, 0
            tracer._root_inputs(ids, names, tensors)
            tracer._root_call = tracer._root_call or (args, kwargs)
        steps.append(
            _StepDraft("module", path, type_name, source, ids, (), names, (), depth, parent, call)
        )
        frame = (index, module, source if torch_module else None, path)
        stack.append(frame)
        if breaker is not None:
            breaker.enter(tracer._step_record(index))
        return frame

    def leave(frame, output):
        """Close the call's step; returns its output (an edit's replacement, if any)."""
        if frame is None:  # a call from another thread (see enter)
            return output
        if stack and stack[-1] is frame:
            stack.pop()
        elif any(f is frame for f in stack):  # calls above it raised; the model caught it
            while stack:
                top = stack.pop()
                if top is frame:
                    break
                step = steps[top[0]]
                step.error = step.error or "raised (caught by the model)"
                step.end = len(steps) - 1
        else:  # a call that started before the trace, or a frame of another tracer
            return output
        index = frame[0]
        step = steps[index]
        step.end = len(steps) - 1
        if frame[3] in edit_paths:  # edits (tracing.edits) replace the output first
            output = edits.on_module(frame[3], step.call, output, index)
        tensors, step.output_names = _module_outputs(output)
        step.outputs = [tensor_id(t, index) for t in tensors]
        if not stack:
            tracer.output = output
        tracer._module_done(frame, tensors)
        return output

    return enter, leave


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
    everything recorded up to the failing step. A ``KeyboardInterrupt`` goes on up as it
    is, with the partial trace (``complete`` False) as its ``.trace``.

    What is recorded, and what is not:

    - only the thread that entered the tracer: another thread calling the same model
      meanwhile runs normally and is not mixed into the trace;
    - never the tracer's own work (its statistics and copies), also when tracers nest;
    - tensors with no data or no dense form here (``meta``, sparse, ``MaskedTensor``...)
      are recorded by shape only, and ``trace.meta["notes"]`` says so;
    - a ``torch.compile``d model (or part) runs eagerly while traced, with a note.

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
        self._thread = threading.get_ident()  # only this thread's calls are recorded
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
            # torch.distributed: collectives wrapped for the trace's duration
            self._ranks = distributed_mod.capture_for(self)
            if self._ranks is not None:
                self._ranks.install()
            self._eager = _force_eager(self._named)
            if self._eager is not None:
                self._notes.setdefault(
                    "the model is torch.compile'd: it ran eagerly while traced (compiled "
                    "code cannot be followed op by op)"
                )
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
            # the recorders close over this tracer: dropped, no cycle keeps the trace (and
            # the arena chunk of its values) alive until the next full collection; the
            # drafts, frozen into the trace now, go before the collection below walks them
            self._enter_module = self._exit_module = None
            if self.trace is not None:
                self._steps, self._tensors, self._ids = [], [], {}
            if self._gc_paused:
                self._gc_paused = False
                gc.enable()
                gc.collect(0)  # the one pass over the trace's new objects, paid here

    def _exit(self, exc: BaseException | None, tb) -> bool:
        self._cleanup()
        self._active = False
        if self._breaker is not None and isinstance(exc, self._breaker.Stop):
            last = len(self._steps) - 1
            for index, *_ in self._stack:  # close the module calls the stop interrupted
                self._steps[index].end = last
            self._stack.clear()
            self.trace = self._finish(None)
            self.trace.meta["stopped_at"] = exc.hit.to_meta()
            return True  # stopped on purpose: the trace so far, no error
        error = None
        failed_inside = exc is not None and (self._stack or self._failed_step is not None)
        if failed_inside and isinstance(exc, Exception):
            error = self._mark_failure(exc, tb)
        elif failed_inside and isinstance(exc, KeyboardInterrupt):
            # interrupted: the trace so far is partial, and says so; Ctrl-C goes on up
            # with it attached (``exc.trace``), so a caller may still save it (a streamed
            # file is closed with it: a valid trace that says it was interrupted)
            self._mark_failure(exc, tb)
            self.trace = self._finish("KeyboardInterrupt: interrupted before the forward ended")
            exc.trace = self.trace  # type: ignore[union-attr]
            return False
        if exc is not None and not isinstance(exc, Exception):
            self._sink.abort()  # stopped from outside (exit...): no file that looks complete
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
        eager, self._eager = getattr(self, "_eager", None), None
        if eager is not None:
            eager.__exit__(None, None, None)

    def _reset(self) -> None:
        # Mutable drafts while recording; frozen records are built once, in _finish().
        self._steps: list[_StepDraft] = []
        self._tensors: list[_TensorDraft] = []  # by record id
        self._values: dict[str, torch.Tensor] = {}
        self._stats = StatsCollector()  # on an accelerator: read back once, in _finish
        self._sink = ValueArena() if self.out is None else StreamedValues(TraceWriter(self.out))
        self._ids: dict[int, tuple] = {}  # id(tensor) -> (weakref, version, record id)
        structure = self._structure = _structure(self.model)
        self._named = [("", self.model), *structure.modules]
        self._param_names = structure.param_names  # id(parameter or buffer) -> dotted name
        self._buffer_ids = structure.buffer_ids
        # open module calls, innermost last: frames (see _module_recorder)
        self._stack: list[tuple[int, nn.Module, SourceLocation | None, str]] = []
        self._param_rids: dict[int, str] = {}  # record id -> parameter or buffer name
        self._param_steps: list[int] = []  # op steps with a parameter among their inputs
        self._shapes_only = self.capture == "shapes"
        self._keep_values = self.capture == "values"
        self._calls: dict[str, int] = {}
        self._failed_step: int | None = None
        self._failure: Failure | None = None
        self._first_input_shape: tuple[int, ...] | None = None
        self._root_call: tuple | None = None  # the root call's (args, kwargs): dims evidence
        self._input_shapes: list[tuple[str, list[int]]] = []
        self._mode = None
        self._skipped_values = 0
        self._notes: dict[str, None] = {}  # what could not be recorded fully, in order
        self._ranks: distributed_mod.RankCapture | None = None
        if self._edits is not None:
            self._edits.reset()

    # ---- extension points: where steps open and where outputs are seen

    def _open_op(self, func, name: str, in_ids: list[int], out_names: tuple) -> tuple:
        """Append the step of an op call (outputs still empty); returns (index, draft)."""
        steps, stack = self._steps, self._stack
        index = len(steps)
        parent, _, source, path = stack[-1]
        if source is None:
            source = caller_location(2)
        if not self._param_rids.keys().isdisjoint(in_ids):  # parameters are named in _finish
            self._param_steps.append(index)
        names = _op_input_names(func, len(in_ids))
        step = _StepDraft(
            "op", path, name, source, in_ids, (), names, out_names, len(stack), parent
        )
        steps.append(step)
        return index, step

    def _op_done(self, index: int, name: str, func, args: tuple, kwargs, outs: tuple) -> None:
        """Every op's tensor outputs, once its step holds their records: attention maps
        (a softmax in an attention module, a fused attention call), the group of a
        functional collective (under torch.distributed), then breakpoints."""
        if name in _NOTED_OPS:
            if name not in _COLLECTIVE_OPS:
                outs = self._attention_op(index, name, func, args, kwargs, outs)
            elif self._ranks is not None:
                self._ranks.functional(index, func, args, kwargs)
        if self._breaker is not None:
            self._check_outputs(index, outs)

    def _module_done(self, frame: tuple, tensors) -> None:
        """Every module call's output tensors, once its step holds their records: attention
        weights an attention module returns as ``output[1]``, then breakpoints."""
        index, module = frame[0], frame[1]
        step = self._steps[index]
        if (
            len(tensors) >= 2
            and step.output_names[1] == "output[1]"
            and tensors[1].dim() == 4
            and id(module) in self._structure.attention
        ):
            self._mark_attention(step.outputs[1], tensors[1])
        if self._breaker is not None:
            self._check_outputs(index, tensors)

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
        step = _StepDraft(
            "op", path, name, source, in_ids, [], tuple(in_names), tuple(out_names),
            len(self._stack), parent,
        )  # fmt: skip
        try:
            result = run()
        except Exception as e:
            step.error = f"{type(e).__name__}: {e}"
            self._failed_step = len(self._steps)
            self._steps.append(step)
            raise
        index = len(self._steps)
        self._steps.append(step)
        # always new records: a collective writes in place, sometimes keeping _version
        with _Disable():
            step.outputs = [self._new_tensor(t, index, t._version if settled else -1) for t in outs]
        if not self._param_rids.keys().isdisjoint(in_ids):
            self._param_steps.append(index)
        return index, result

    def _op_failed(self, func, name: str, in_ids: list[int], exc: Exception) -> None:
        """The step of an op call that raised, with its error (and no outputs)."""
        index, step = self._open_op(func, name, in_ids, ())
        step.error = f"{type(exc).__name__}: {exc}"
        self._failed_step = index

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
        record = _TensorDraft(t.shape, t.dtype, t.device, producer)
        self._tensors.append(record)
        try:  # noqa: SIM105 - try/except costs nothing here; suppress() is a call
            self._ids[key] = (weakref.ref(t), version, rid)
        except TypeError:  # pragma: no cover - tensor subclasses without weakref support
            pass
        if self._ranks is not None:  # a DTensor is recorded as its local shard
            local = self._ranks.local_view(rid, t)
            if local is not None:
                t, source, record.shape = local, None, local.shape
        name = self._param_names.get(key)
        if name is not None:  # a parameter or buffer: no stats, no copy
            record.producer = None
            # a set lookup: isinstance(t, nn.Parameter) runs a Python metaclass check
            record.role = "buffer" if key in self._buffer_ids else "param"
            self._param_rids[rid] = name
            return rid
        if self._shapes_only or version != t._version:
            return rid
        # our own tensor calls: no function mode (an outer tracer's included) may see them
        with _Disable():
            try:
                view = _view_of(t, source[0]) if source is not None and source[0] is not t else None
                if view is not None:
                    self._derive_from_view(record, rid, t, view, *source)
                # stats first: they are what raises for a tensor kind without data here
                # (before a copy or a streamed write reads its memory). A small CPU tensor's
                # wait for the batch in _finish, from a copy that its kept value then shares;
                # on an accelerator: pending, no sync
                if record.stats is None:
                    record.stats = self._stats.add(t)
                if self._keep_values and record.value_key is None:
                    self._keep_value(rid, t)
            except _UNSUPPORTED as e:  # meta, sparse, masked... tensors: shapes only
                record.stats = None
                self._note_unsupported(t, e)
        return rid

    def _note_unsupported(self, t: torch.Tensor, e: BaseException) -> None:
        """Remember (once per kind) that tensors of this kind were recorded by shape only."""
        kind = _tensor_kind(t)
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        note = f"{kind} tensors: recorded by shape only, no stats or values ({reason})"
        self._notes.setdefault(note)

    def _derive_from_view(self, record, rid: int, t, view: str, src_t, src_rid: int) -> None:
        """Stats and kept value of ``t``, a view of ``src_t``, taken from ``src_t``'s record:
        the same stats when it views all of it, its copy viewed the same way."""
        src = self._tensors[src_rid]
        if view == "all":  # same elements, so the same statistics
            record.stats = src.stats
        kept = None if src.value_key is None else self._values.get(src.value_key)
        # (None too when it was streamed to the file: the view is then written itself)
        if kept is not None and kept.is_contiguous() and src_t.is_contiguous():
            offset = t.storage_offset() - src_t.storage_offset()
            value = kept.as_strided(t.shape, t.stride(), kept.storage_offset() + offset)
            self._store_value(rid, value)

    def _keep_value(self, rid: int, t: torch.Tensor, force: bool = False) -> None:
        """Keep a copy of ``t`` (record ``rid``), unless over the size cap (``force``:
        whatever its size, as for attention maps) or one is kept already."""
        if self._tensors[rid].value_key is not None or (force and t.is_meta):  # no data
            return
        dtype = t.dtype
        if self.value_dtype is not None and t.is_floating_point():
            dtype = self.value_dtype
        cap = self.value_cap
        if cap is not None and t.numel() * dtype.itemsize > cap and not force:
            self._skipped_values += 1
            return
        # a small CPU tensor's stats copy (contiguous, private) serves as its kept value
        copy = getattr(self._tensors[rid].stats, "copy", None)  # PendingStats.copy
        if copy is not None and copy.dtype == dtype and self.out is None:
            self._store_value(rid, copy)
            return
        # into the arena, or straight to the file when streaming (then nothing is held)
        key, kept = self._sink.keep(f"t{rid}", t, dtype)
        if key is None:  # streaming, and the file cannot hold this dtype
            self._skipped_values += 1
            return
        self._store_value(rid, kept, key)

    def _store_value(self, rid: int, value: torch.Tensor | None, key: str | None = None) -> None:
        """The one place a kept value goes into the trace (``trace.values``); ``None``:
        it went to the file under ``key``."""
        key = key or f"t{rid}"
        if value is not None:
            self._values[key] = value
        self._tensors[rid].value_key = key

    def _mark_attention(self, rid: int, t: torch.Tensor) -> None:
        """Record ``rid`` is an attention map: its role says so and its value is kept."""
        rec = self._tensors[rid]
        if rec.role is None:
            rec.role = "attention"
        self._keep_value(rid, t, force=True)

    def _root_inputs(self, ids: list[int], names: tuple, tensors) -> None:
        """The root call's tensors are the trace's inputs (first call: also their shapes)."""
        for rid in ids:
            record = self._tensors[rid]
            if record.producer is None and record.role is None:
                record.role = "input"
        if self._first_input_shape is None:
            for n, t in zip(names, tensors):
                self._input_shapes.append((n, list(t.shape)))
            if tensors:
                self._first_input_shape = tuple(tensors[0].shape)

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
        call = self._steps[index].call
        new = self._edits.on_op(path, call, name, result, len(self._steps), inputs)
        if isinstance(new, _Tensor):
            return new, (new,)
        return new, tuple([r for r in new if isinstance(r, _Tensor)])

    def _pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        with _Disable():  # our own tensor calls must not reach the op mode
            self._enter_module(self._structure.specs[id(module)], module, args, kwargs)

    def _post_hook(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        with _Disable():
            for frame in reversed(self._stack):
                if frame[1] is module:
                    new = self._exit_module(frame, output)
                    return None if new is output else new  # an edit replaces the output
        return None

    # ---- attention maps

    def _attention_op(self, index: int, name: str, func, args, kwargs, outs: tuple) -> tuple:
        """Attention maps made by op ``index`` (a softmax in an attention module, a fused
        attention call); returns its outputs with any rebuilt map added."""
        if name == "softmax" or name == "_softmax":
            module = self._stack[-1][1]
            if outs[0].dim() == 4 and id(module) in self._structure.attention:
                self._mark_attention(self._steps[index].outputs[0], outs[0])
            return outs
        if name == "scaled_dot_product_attention":
            weights = self._fused_attention_map(args, kwargs)
        else:
            weights = self._mha_attention_map(index, func, args, kwargs, outs)
        if weights is None:
            return outs
        self._add_attention_output(index, weights)
        return (*outs, weights)

    def _add_attention_output(self, index: int, weights: torch.Tensor) -> None:
        """Add rebuilt attention weights to op ``index``'s outputs, as an attention map."""
        step = self._steps[index]
        rid = self._tensor_id(weights, index)
        step.outputs = (*step.outputs, rid)
        step.output_names = (*step.output_names, "attention_weights")
        self._mark_attention(rid, weights)

    def _fused_attention_map(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """``F.scaled_dot_product_attention`` returns no weights: rebuild them from its
        query, key and mask (``tracing.fused_attention``); None if the call is unusual."""
        from tracing.fused_attention import weights_from_call

        try:
            return weights_from_call(args, kwargs)  # (B, H, T, T)
        except (TypeError, ValueError, RuntimeError):
            return None

    def _mha_attention_map(self, index: int, func, args: tuple, kwargs: dict, outs):
        """``nn.MultiheadAttention`` (``F.multi_head_attention_forward``) returns per-head
        weights only when asked (``need_weights=True, average_attn_weights=False``). When
        they were not returned, compute them once more from the same arguments, asking for
        them (the model's own result is untouched, and dropout is off in the recomputation,
        so no random numbers are drawn). The call receives ``(T, B, C)`` tensors whatever
        ``batch_first`` says, so the weights come back ``(B, H, T, S)``. Returns them, or
        None (when they were returned per head already, they are marked here)."""
        if len(outs) >= 2 and outs[1].dim() == 4:  # already per head: mark it
            self._mark_attention(self._steps[index].outputs[1], outs[1])
            return None
        try:
            bound = _mha_signature(func).bind(*args, **kwargs)
            bound.arguments.update(need_weights=True, average_attn_weights=False, training=False)
            _, weights = func(*bound.args, **bound.kwargs)
        except (TypeError, ValueError, RuntimeError):
            return None
        if not isinstance(weights, _Tensor) or weights.dim() != 4:
            return None  # unbatched input: (H, T, S) has no batch axis to show
        return weights

    # ---- breakpoints (tracing.breakpoints)

    def _step_record(self, index: int) -> Step:
        """Step ``index`` as it stands now, frozen (what a breakpoint condition sees)."""
        return self._steps[index].freeze(index, self._input_names(self._steps[index]))

    def _check_outputs(self, index: int, tensors) -> None:
        """Raise the breaker's stop if a condition holds for this step's outputs."""
        records = [self._tensors[rid].freeze(rid) for rid in self._steps[index].outputs]
        self._breaker.exit(self._step_record(index), records, list(tensors))

    # ---- failure

    def _mark_failure(self, exc: BaseException, tb) -> str:
        """Set ``error`` on the failing step and every enclosing module step; return msg."""
        detail = f"{type(exc).__name__}: {exc}"
        last = len(self._steps) - 1
        failed = self._failed_step
        if failed is None and self._stack:
            failed = self._stack[-1][0]
        for index, *_ in self._stack:
            step = self._steps[index]
            step.error = step.error or detail
            step.end = last
        if failed is None:  # pragma: no cover - nothing ran
            return f"forward pass failed: {detail}"
        step = self._steps[failed]
        step.error = step.error or detail
        source: SourceLocation | None = step.source
        if step.kind == "module":
            source = location_from_traceback(tb) or source
        self._failure = failure_of(failed, exc, tb, source)
        where = f"{step.module or '<root>'} · {step.op}"
        at = ""
        if source is not None:
            at = f" at {source.file}:{source.line}"
            if source.text:
                at += f" `{source.text}`"
        self._stack.clear()
        return f"forward pass failed in {where}{at}: {detail}"

    # ---- building the record

    def _input_names(self, step: _StepDraft) -> tuple[str, ...]:
        """An op's input names with each parameter or buffer named by its path."""
        names, rids = step.input_names, self._param_rids
        if step.kind != "op" or rids.keys().isdisjoint(step.inputs):
            return names
        return tuple([rids.get(r) or d for r, d in zip(step.inputs, names)])

    def _finish(self, error: str | None) -> Trace:
        model = self.model
        config = getattr(model, "config", None)
        if config is None:  # DistributedDataParallel / DataParallel wrap the model
            config = getattr(getattr(model, "module", None), "config", None)
        sizes = dims_mod.resolve_sizes(self.dims, config, self._first_input_shape, model)
        steps = self._steps
        for index in self._param_steps:
            steps[index].input_names = self._input_names(steps[index])
        meta = {
            "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
            "config": self._structure.config_dict(config),
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
        if self._notes:
            meta["notes"] = list(self._notes)
        meta.update(self.extra_meta)
        self._stats.finish()  # statistics still on a device: read back at once, here
        self._sink.finish()  # copies from a device: waited for once, here
        records = [step.seal(index) for index, step in enumerate(steps)]
        tensors = self._tensor_records(dims_mod.namer_for(sizes))
        tensors = refine_dims(records, tensors, sizes)  # names that follow the ops
        trace = Trace(
            steps=records,
            modules=self._structure.module_infos(model),
            tensors=name_axes(self._dims_subject(config, error), records, tensors, sizes, meta),
            meta=meta,
            values=self._values,
            error=error,
            failure=self._failure,
            sources=embed_sources(records, self._failure),
        )
        if self.out is not None and not self._sink.aborted:
            self._close_file(trace)
        return trace

    def _dims_subject(self, config, error: str | None) -> Subject:
        """What tracing.dim_names needs to prove each axis name (a second pass included:
        not after a forward that raised or was interrupted)."""
        call, self._root_call = self._root_call, None
        return Subject(self.model, config, None if error else call, dict(self._param_rids),
                       self.dims, self.train, self.ops, self._ranks is not None)  # fmt: skip

    def _close_file(self, trace: Trace) -> None:
        """A streamed trace's header, then the file takes its name and ``trace.values``
        reads from it lazily. (``tracing.backward`` closes it later: the backward streams
        into the same file.)"""
        self._sink.writer.close(trace)
        trace.values = trace_file.load(self.out).values

    def _tensor_records(self, namer) -> list[TensorRecord]:
        """Every tensor record, frozen, with its axes named (``namer``, tracing.dims)."""
        steps, param_paths = self._steps, self._param_rids
        named = namer.named_cache()  # (shape, context) -> dims, filled by namer() calls
        unseen = dims_mod.UNSEEN
        records = []
        for rid, draft in enumerate(self._tensors):
            shape = tuple(draft.shape)
            # the module a tensor came from breaks ties between equal sizes (F == V)
            producer = draft.producer
            context = param_paths.get(rid, "") if producer is None else steps[producer].module
            dims = named.get((shape, context), unseen)
            if dims is unseen:
                dims = namer(shape, context)
            if draft.role == "attention" and dims is not None and len(dims) == 4:
                dims = ("B", "H", "T", "T") if dims[:2] == ("B", "H") else dims
            records.append(draft.seal(rid, dims, shape))
        return records


# --------------------------------------------------------------------------- helpers


def _view_of(t: torch.Tensor, src: torch.Tensor) -> str | None:
    """``"all"`` if ``t`` views exactly the elements of ``src``, ``"part"`` if a subset of
    them, ``None`` if it is not a view into ``src``'s elements (or ``src`` is strided).
    """
    base = t._base  # first: most outputs are not views
    if base is None or (base is not src and base is not src._base):
        return None
    if t.dtype != src.dtype or not src.is_contiguous():
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


def config_dict(config: Any) -> dict | None:
    """The model's config as a JSON-able dict (``to_dict()`` or a dataclass), else None."""
    raw = None
    if config is None:
        return None
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
    value_cap: int | None = DEFAULT_VALUE_CAP,
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
