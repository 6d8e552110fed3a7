"""Capture one forward pass of any ``nn.Module``: every module call and every tensor op.

Two instruments work together:

- **Module hooks.** A forward pre-hook and a forward hook (with kwargs) on every module in
  ``named_modules()``. The pre-hook opens a *module step* (so its index comes before the
  ops that ran inside it) and records the inputs by their parameter names (``q``, ``k``,
  ``mask``); the hook closes it with the outputs (``output``, ``output[1]``,
  ``output['logits']``).
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
import inspect
import json
import time
import weakref
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from tracing import dims as dims_mod
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
from tracing.stats import tensor_stats

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

_SKIP = "skip"
# id(model) -> (weakref to it, (module ids, parameter ids), its module infos)
_INFO_CACHE: dict[int, tuple[Any, tuple, dict[str, ModuleInfo]]] = {}
_func_info: dict[Any, str] = {}  # func -> op name, or _SKIP


# --------------------------------------------------------------------------- per model


class _Structure:
    """What a trace needs to know of a model's modules and parameters, built once per model
    and reused while the same module, parameter and buffer objects stay in place."""

    __slots__ = ("buffer_ids", "key", "named", "param_names", "param_sig", "paths")

    def __init__(self, model: nn.Module, key: tuple):
        self.key = key
        self.named = list(model.named_modules())
        self.paths = {id(m): p for p, m in self.named}
        self.param_names: dict[int, str] = {}  # first name wins (tied weights)
        self.buffer_ids: set[int] = set()
        param_ids = []
        for path, module in reversed(self.named):
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


_STRUCTURES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _structure_key(model: nn.Module) -> tuple:
    """Identity of every submodule (with its name), parameter and buffer, cheaply."""
    key: list = []
    todo = [model]
    while todo:
        module = todo.pop()
        key.append(id(module))
        for d in (module._parameters, module._buffers):
            for name, p in d.items():
                key.append(name)
                key.append(id(p))
        for name, child in module._modules.items():
            key.append(name)
            if child is not None:
                todo.append(child)
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
        self.tracer = tracer

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # The hottest function of a trace: one dict lookup decides, no kwargs copy.
        try:
            name = _func_info[func]
        except (KeyError, TypeError):  # first call of this func, or an unhashable one
            name = _classify(func)
        tracer = self.tracer
        if name is _SKIP or not tracer._stack:
            return func(*args, **kwargs) if kwargs else func(*args)
        return tracer._record_op(func, name, args, kwargs or _NO_KWARGS)


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
        value_cap: at ``"values"``, tensors larger than this many bytes keep no copy.
        value_dtype: at ``"values"``, store floating copies in this dtype (e.g. float16).
        train: trace in training mode (dropout active) instead of eval mode.
        ops: also record tensor ops (not only module calls).
        meta: extra entries for ``trace.meta`` (e.g. ``tokens``, ``text``).
        break_on: breakpoint conditions (``tracing.breakpoints``: ``NonFinite()``,
            ``AbsAbove(1e4)``, ``ModuleIs("blocks.2")``...). The forward stops at the first
            step that meets one; the trace ends there, with ``meta["stopped_at"]``.
    """

    def __init__(
        self,
        model: nn.Module,
        capture: str = "stats",
        *,
        dims: Mapping[str, int] | None = None,
        value_cap: int = DEFAULT_VALUE_CAP,
        value_dtype: torch.dtype | None = None,
        train: bool = False,
        ops: bool = True,
        meta: Mapping[str, Any] | None = None,
        break_on: Any = None,
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
        self.value_cap = int(value_cap)
        self.value_dtype = value_dtype
        self.train = train
        self.ops = ops
        self.extra_meta = dict(meta) if meta else {}
        self._breaker = None
        if break_on:
            from tracing.breakpoints import LiveBreaker

            self._breaker = LiveBreaker(break_on)
        self.trace: Trace | None = None
        self.output: Any = None  # the root module's last output, when it returned
        self._active = False

    # ---- lifecycle

    def __enter__(self) -> Tracer:
        if self._active:
            raise RuntimeError("this Tracer is already active")
        self._reset()
        model = self.model
        want = self.train
        # remember only the flags we change; model.train() is skipped when none differ
        self._training = [(m, m.training) for _, m in self._named if m.training != want]
        if self._training:
            model.train(want)
        self._handles = []
        self._wrapped = []
        try:
            for path, module in self._named:
                self._instrument(path, module)
            if self.ops:
                self._mode = _OpMode(self)
                self._mode.__enter__()
        except BaseException:
            self._cleanup()
            raise
        self._active = True
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._cleanup()
        self._active = False
        if self._breaker is not None and isinstance(exc, self._breaker.Stop):
            last = len(self._steps) - 1
            for index in self._stack:  # close the module calls the stop interrupted
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
        structure = _structure(self.model)
        self._named = structure.named
        self._paths = structure.paths
        self._param_names = structure.param_names  # id(parameter or buffer) -> dotted name
        self._param_sig = structure.param_sig
        self._buffer_ids = structure.buffer_ids
        self._stack: list[int] = []  # open module steps, innermost last
        self._stack_modules: list[nn.Module] = []
        self._op_source: list[SourceLocation | None] = []  # per open module, see below
        self._inherit: dict[type, bool] = {}
        self._calls: dict[str, int] = {}
        self._failed_step: int | None = None
        self._first_input_shape: tuple[int, ...] | None = None
        self._input_shapes: list[tuple[str, list[int]]] = []
        self._mode = None
        self._skipped_values = 0
        self._attention_types: dict[str, bool] = {}

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
        key = id(t)
        if version is None:
            version = t._version
        entry = self._ids.get(key)
        if entry is not None and entry[1] == version and entry[0]() is t:
            return entry[2]
        rid = len(self._tensors)
        dtype = t.dtype
        record = [
            t.shape,  # a torch.Size (a tuple); made a plain tuple in _finish
            _DTYPE_NAMES.get(dtype) or str(dtype)[6:],
            "cpu" if t.is_cpu else str(t.device),
            None,
            None,
            producer,
            None,
        ]
        self._tensors.append(record)
        try:  # noqa: SIM105 - try/except costs nothing here; suppress() is a call
            self._ids[key] = (weakref.ref(t), version, rid)
        except TypeError:  # pragma: no cover - tensor subclasses without weakref support
            pass
        if key in self._param_names:  # a parameter or buffer: no stats, no copy
            record[5] = None
            # a set lookup: isinstance(t, nn.Parameter) runs a Python metaclass check
            record[6] = "buffer" if key in self._buffer_ids else "param"
            return rid
        if self.capture == "shapes" or version != t._version:
            return rid
        view = _view_of(t, source[0]) if source is not None and source[0] is not t else None
        if view is not None:
            src = self._tensors[source[1]]
            if view == "all":  # same elements, so the same statistics
                record[3] = src[3]
            if src[4] is not None:
                copy = self._values[src[4]]
                if copy.is_contiguous() and source[0].is_contiguous():
                    offset = t.storage_offset() - source[0].storage_offset()
                    value = copy.as_strided(t.shape, t.stride(), copy.storage_offset() + offset)
                    key_ = f"t{rid}"
                    self._values[key_] = value
                    record[4] = key_
        if record[3] is None:
            record[3] = tensor_stats(t)
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

    def _param_record_names(self):
        for key, (_, _, rid) in self._ids.items():
            name = self._param_names.get(key)
            if name is not None:
                yield name, rid

    def _keep_value(self, rid: int, t: torch.Tensor, force: bool = False) -> None:
        rec = self._tensors[rid]
        if rec[4] is not None:
            return
        dtype = t.dtype
        if self.value_dtype is not None and t.is_floating_point():
            dtype = self.value_dtype
        nbytes = t.numel() * torch.empty((), dtype=dtype).element_size()
        if nbytes > self.value_cap and not force:
            self._skipped_values += 1
            return
        with torch.no_grad():
            copy = t.detach().to(device="cpu", dtype=dtype, copy=True)
        key = f"t{rid}"
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

    def _instrument(self, path: str, module: nn.Module) -> None:
        """Wrap ``module.forward`` for this trace (an instance attribute, removed on exit).

        A wrapper is the cheapest way to see a module call begin and end: a module with
        forward hooks takes ``Module._call_impl``'s slow path (a closure and two hook loops
        per call), and registering and removing two hook handles per module costs more
        than a small model's whole forward. ``nn.Module.__call__`` still runs every hook
        the user registered; the wrapper runs inside them. Script modules, whose
        ``forward`` cannot be replaced, get a pre-hook and a hook instead.
        """
        if isinstance(module, torch.jit.ScriptModule):
            pre, post = self._pre_hook, self._post_hook
            self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            self._handles.append(module.register_forward_hook(post, with_kwargs=True))
            return
        own = module.__dict__
        previous = own.get("forward")
        inner = module.forward
        enter, leave = self._enter_module, self._exit_module
        disable = _Disable

        def forward(*args, **kwargs):
            with disable():  # our own tensor calls must not reach the op mode
                enter(path, module, args, kwargs)
            output = inner(*args, **kwargs)
            with disable():
                leave(path, module, output)
            return output

        forward.__wrapped__ = inner  # inspect.signature(module.forward) still works
        self._wrapped.append((module, previous))
        own["forward"] = forward

    def _pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        with _Disable():  # our own tensor calls must not reach the op mode
            self._enter_module(self._paths[id(module)], module, args, kwargs)

    def _post_hook(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        with _Disable():
            self._exit_module(self._paths[id(module)], module, output)

    def _enter_module(self, path: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        stack = self._stack
        index = len(self._steps)
        call = self._calls.get(path, 0)
        self._calls[path] = call + 1
        parent = stack[-1] if stack else None
        source = caller_location(2)
        cls = type(module)
        step = [
            "module", path, cls.__name__, source, (), (), (), (),
            len(stack), parent, None, call, None,
        ]  # fmt: skip
        self._steps.append(step)
        stack.append(index)
        self._stack_modules.append(module)
        # ops inside torch's own modules (nn.Linear...) have this step's source line: every
        # frame between is torch code, so the frame walk can be skipped for them
        inherit = self._inherit.get(cls)
        if inherit is None:
            inherit = self._inherit[cls] = cls.__module__.startswith("torch.")
        self._op_source.append(source if inherit else None)

        tensors: list = []
        names: list = []
        pos_names, _ = _forward_params(module)
        for i, arg in enumerate(args):
            name = pos_names[i] if i < len(pos_names) else f"args[{i}]"
            _flatten(arg, name, tensors, names)
        for key, arg in kwargs.items():
            _flatten(arg, key, tensors, names)
        is_root = parent is None
        ids = []
        for t in tensors:
            rid = self._tensor_id(t, None)
            if is_root and self._tensors[rid][5] is None and self._tensors[rid][6] is None:
                self._tensors[rid][6] = "input"
            ids.append(rid)
        if is_root and self._first_input_shape is None:
            for n, t in zip(names, tensors):
                self._input_shapes.append((n, list(t.shape)))
            if tensors:
                self._first_input_shape = tuple(tensors[0].shape)
        step[4] = tuple(ids)
        step[6] = tuple(names)
        if self._breaker is not None:
            self._breaker.enter(self._step_record(index))

    def _exit_module(self, path: str, module: nn.Module, output: Any) -> None:
        stack = self._stack
        # pop to this module's step; anything above it exited by an exception (caught)
        while stack:
            index = stack.pop()
            mod = self._stack_modules.pop()
            self._op_source.pop()
            if mod is module and self._steps[index][1] == path:
                break
            self._steps[index][12] = self._steps[index][12] or "raised (caught by the model)"
            self._steps[index][10] = len(self._steps) - 1
        else:  # pragma: no cover - a hook for a call we never saw start
            return
        step = self._steps[index]
        tensors: list = []
        names: list = []
        _flatten(output, "output", tensors, names)
        tensor_id = self._tensor_id
        step[5] = tuple([tensor_id(t, index) for t in tensors])
        step[7] = tuple(names)
        step[10] = len(self._steps) - 1
        if not stack:
            self.output = output
        # attention weights returned by an attention module: (output, weights)
        if (
            len(tensors) >= 2
            and names[1] == "output[1]"
            and tensors[1].dim() == 4
            and self._is_attention_module(path, module)
        ):
            self._mark_attention(step[5][1], tensors[1])
        if self._breaker is not None:
            self._check_outputs(index, tensors)

    def _is_attention_module(self, path: str, module: nn.Module) -> bool:
        """Attention modules by type name: ours, ``nn.MultiheadAttention``, HF ``*Attention``."""
        name = type(module).__name__
        known = self._attention_types.get(name)
        if known is None:
            lowered = name.lower()
            known = "attention" in lowered or "attn" in lowered
            self._attention_types[name] = known
        return known

    # ---- op recording

    def _record_op(self, func, name: str, args: tuple, kwargs: dict):
        # tensors among the arguments, with their versions before the call
        tensors: list = []
        tensor, sequence = _Tensor, (tuple, list)
        for a in args:
            if isinstance(a, tensor):
                tensors.append(a)
            elif isinstance(a, sequence):
                for b in a:
                    if isinstance(b, tensor):
                        tensors.append(b)
        if kwargs:
            for a in kwargs.values():
                if isinstance(a, tensor):
                    tensors.append(a)
        versions = [t._version for t in tensors]
        try:
            result = func(*args, **kwargs)
        except Exception as e:
            index = self._add_op_step(name, tensors, versions, (), (), func)
            self._steps[index][12] = f"{type(e).__name__}: {e}"
            self._failed_step = index
            raise
        # tensors among the results
        if isinstance(result, _Tensor):
            outs = (result,)
        elif isinstance(result, (tuple, list)):
            outs = tuple(r for r in result if isinstance(r, _Tensor))
            if not outs:
                return result
        elif result is None and tensors and tensors[0]._version != versions[0]:
            outs = (tensors[0],)  # x[i] = v: in place, returns None
        else:
            return result
        index = self._add_op_step(name, tensors, versions, outs, result, func)
        if name == "softmax" or name == "_softmax":
            self._maybe_attention_softmax(index, outs[0])
        elif name == "scaled_dot_product_attention":
            outs = (*outs, *self._fused_attention_map(index, args, kwargs))
        elif name == "multi_head_attention_forward":
            outs = (*outs, *self._mha_attention_map(index, func, args, kwargs, outs))
        if self._breaker is not None:
            self._check_outputs(index, outs)
        return result

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
            index=index, kind=s[0], module=s[1], op=s[2], source=s[3], inputs=s[4],
            outputs=s[5], input_names=s[6], output_names=s[7], depth=s[8], parent=s[9],
            end=s[10], call=s[11], error=s[12],
        )  # fmt: skip

    def _check_outputs(self, index: int, tensors) -> None:
        """Raise the breaker's stop if a condition holds for this step's outputs."""
        records = []
        for rid in self._steps[index][5]:
            shape, dtype, device, stats, key, producer, role = self._tensors[rid][:7]
            record = TensorRecord(
                id=rid, shape=shape, dtype=dtype, device=device, stats=stats,
                value_key=key, producer=producer, role=role,
            )  # fmt: skip
            records.append(record)
        self._breaker.exit(self._step_record(index), records, list(tensors))

    def _add_op_step(self, name, tensors, versions, outs, result, func=None) -> int:
        steps = self._steps
        index = len(steps)
        stack = self._stack
        parent = stack[-1]
        source = self._op_source[-1]
        if source is None:
            source = caller_location(3)
        step = [
            "op", steps[parent][1], name, source, (), (), (), (),
            len(stack), parent, None, 0, None,
        ]  # fmt: skip
        steps.append(step)
        tensor_id = self._tensor_id
        seen = self._ids
        params = self._param_names
        ids = []
        named_param = False
        for t, version in zip(tensors, versions):
            key = id(t)
            if key in params:
                named_param = True
            entry = seen.get(key)  # most inputs were recorded when they were made
            if entry is not None and entry[1] == version and entry[0]() is t:
                ids.append(entry[2])
            else:
                ids.append(tensor_id(t, None, version))
        step[4] = ids = tuple(ids)
        n = len(tensors)
        try:
            table = _arg_tables.get(func, _ARG_NAMES)
        except TypeError:  # unhashable callable
            table = _ARG_NAMES
        if n < len(table):
            names = table[n]
        else:
            names = _arg_names(n, "self" if table is _METHOD_ARG_NAMES else "input")
        if named_param:
            names = tuple(params.get(id(t)) or default for t, default in zip(tensors, names))
        step[6] = names
        if outs:
            source_pair = (tensors[0], ids[0]) if tensors else None
            if len(outs) == 1 and isinstance(result, _Tensor):
                step[5] = (tensor_id(outs[0], index, None, source_pair),)
                step[7] = _ONE_OUTPUT
            else:
                step[5] = tuple([tensor_id(t, index, None, source_pair) for t in outs])
                k = len(outs)
                step[7] = _OUTPUT_NAMES[k] if k < len(_OUTPUT_NAMES) else _output_names(k)
        return index

    def _maybe_attention_softmax(self, index: int, out: torch.Tensor) -> None:
        """A softmax producing (B, H, T, T) inside an attention module is an attention map."""
        if out.dim() != 4:
            return
        parent = self._steps[index][9]
        module = self._stack_modules[-1]
        path = self._steps[parent][1]
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
            failed = self._stack[-1]
        for index in self._stack:
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
        param_paths = {rid: name for name, rid in self._param_record_names()}
        tensors = []
        append, new_record = tensors.append, _new_tensor_record
        named = namer.named_cache()  # (shape, context) -> dims, filled by namer() calls
        unseen = dims_mod.UNSEEN
        for rid, (size, dtype, device, stats, key, producer, role) in enumerate(self._tensors):
            shape = tuple(size)
            # the module a tensor came from breaks ties between equal sizes (F == V)
            context = param_paths.get(rid, "") if producer is None else raw_steps[producer][1]
            dims = named.get((shape, context), unseen)
            if dims is unseen:
                dims = namer(shape, context)
            if role == "attention" and dims is not None and len(dims) == 4:
                dims = ("B", "H", "T", "T") if dims[:2] == ("B", "H") else dims
            append(new_record(rid, shape, dtype, device, dims, stats, key, producer, role))
        new_step = _new_step
        steps = [new_step(i, *s) for i, s in enumerate(raw_steps)]
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
        meta.update(self.extra_meta)
        return Trace(
            steps=steps,
            modules=self._module_infos(),
            tensors=tensors,
            meta=meta,
            values=self._values,
            error=error,
        )


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


def _builder(cls, count: int):
    """A function ``build(v0, v1, ...)`` filling the first ``count`` fields of the frozen
    record ``cls`` in order (later fields get their declared defaults), without running
    its ``__init__``: one dict literal per record, for thousands of steps per trace."""
    fields, defaults = _spec(cls)
    args = ", ".join(f"v{i}" for i in range(count))
    items = [f"{name!r}: v{i}" for i, name in enumerate(fields[:count])]
    for name in fields[count:]:
        call = "()" if callable(defaults[name]) else ""
        items.append(f"{name!r}: defaults[{name!r}]{call}")
    source = (
        f"def build({args}):\n"
        f"    obj = new(cls)\n"
        f"    set_dict(obj, '__dict__', {{{', '.join(items)}}})\n"
        f"    return obj\n"
    )
    namespace = {"new": object.__new__, "cls": cls, "set_dict": object.__setattr__}
    namespace["defaults"] = defaults
    exec(source, namespace)  # generated from dataclass field names only
    return namespace["build"]


_new_step = _builder(Step, 14)
_new_tensor_record = _builder(TensorRecord, 9)


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
    **kwargs: Any,
) -> Trace:
    """Run ``model(*args, **kwargs)`` once and return everything it did as a :class:`Trace`.

    Runs in eval mode and without autograd (``train=True`` / ``grad=True`` to change
    that). If the forward raises, :class:`tracing.TraceError` is raised ``from`` the
    original exception, with the partial trace as ``.trace``. With ``break_on``, it stops
    at the first step that meets a condition and returns the trace up to there, with
    ``meta["stopped_at"]``. See :class:`Tracer` for the other arguments.
    """
    tracer = Tracer(
        model, capture, dims=dims, value_cap=value_cap, value_dtype=value_dtype,
        train=train, ops=ops, meta=meta, break_on=break_on,
    )  # fmt: skip
    with torch.set_grad_enabled(grad), tracer:
        model(*args, **kwargs)
    assert tracer.trace is not None
    return tracer.trace


__all__ = ["DEFAULT_VALUE_CAP", "Tracer", "module_infos", "trace"]
