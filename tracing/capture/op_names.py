"""What steps and tensors are called: op names, argument names, output names.

An op step is named after the torch function or method that ran (``matmul``,
``transpose``, ``add`` for the residual ``+``); its inputs after the call's parameters
(``input``, ``other``; ``self`` for a method), a module's after its ``forward``'s, and
outputs ``output``, ``output[1]``, ``output['logits']``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

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


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32`` (the record's dtype, without the prefix)."""
    return _DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")


UNSUPPORTED = (RuntimeError, NotImplementedError, TypeError, ValueError)
"""What computing stats or a copy raises for a tensor kind that has no data or no dense
form here (meta, sparse, masked, some subclasses): those are recorded by shape."""


def tensor_kind(t: torch.Tensor) -> str:
    """A short name for a tensor's kind, for notes: ``meta``, ``sparse_coo``, a subclass."""
    if type(t) not in (torch.Tensor, nn.Parameter):
        return type(t).__name__
    if t.is_meta:
        return "meta"
    if t.layout != torch.strided:
        return str(t.layout).removeprefix("torch.")
    return f"{dtype_name(t.dtype)} on {t.device.type}"


def force_eager(named: list) -> Any:
    """For a model with ``torch.compile``d parts (``OptimizedModule``), an entered context
    that runs them eagerly until exited (compiled code runs ops the function mode cannot
    follow, and fails inside it); None for any other model."""
    if not any(type(m).__name__ == "OptimizedModule" for _, m in named):
        return None
    stance = torch.compiler.set_stance("force_eager")
    stance.__enter__()
    return stance


def device_name(device: torch.device) -> str:
    """``cpu``, ``cuda:0``... (cached: ``str(device)`` builds a new string every call)."""
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = str(device)
    return name


SKIP = "skip"
func_info: dict[Any, str] = {}  # func -> op name, or SKIP


def _op_name(func: Any) -> str:
    """The op name a person expects: ``add`` for ``+``, ``getitem`` for ``x[i]``."""
    name = getattr(func, "__name__", None) or type(func).__name__
    if name == "__get__":  # a property such as ``.T`` or ``.shape``
        owner = getattr(func, "__self__", None)
        prop = getattr(owner, "__name__", "") or "get"
        return SKIP if prop in _SKIP_PROPERTIES or not prop else prop
    if name in _SKIP_NAMES:
        return SKIP
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


def classify(func: Any) -> str:
    try:
        info = func_info.get(func)
    except TypeError:  # unhashable callable
        return _op_name(func)
    if info is None:
        info = _op_name(func)
        func_info[func] = info
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


def mha_signature(func: Any) -> inspect.Signature:
    found = _mha_signatures.get(func)
    if found is None:
        found = _mha_signatures[func] = inspect.signature(func)
    return found


FUNCTIONAL_COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_reduce_coalesced",
        "all_gather_into_tensor",
        "all_gather_into_tensor_coalesced",
        "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced",
        "all_to_all_single",
        "broadcast",
    }
)
"""Op names of ``torch.ops._c10d_functional`` collectives, as the tracer names steps
(here, not in :mod:`~tracing.capture.distributed`: a trace outside a process group
never imports that)."""


# --------------------------------------------------------------------------- names


def _arg_names(n: int, first: str = "input") -> tuple[str, ...]:
    """Names of an op's tensor arguments by position: ``input`` (``self`` for a tensor
    method), ``arg1``, ``arg2``..."""
    return (first, *(f"arg{i}" for i in range(1, n)))


_ARG_NAMES = tuple(_arg_names(n) if n else () for n in range(9))
_METHOD_ARG_NAMES = tuple(_arg_names(n, "self") if n else () for n in range(9))
_arg_tables: dict[Any, tuple] = {}  # func -> _METHOD_ARG_NAMES for tensor methods


def op_input_names(func: Any, n: int) -> tuple[str, ...]:
    """Names of the ``n`` tensor arguments of a call of ``func`` (see :func:`_arg_names`)."""
    try:
        table = _arg_tables.get(func, _ARG_NAMES)
    except TypeError:  # unhashable callable
        table = _ARG_NAMES
    return table[n] if n < len(table) else _arg_names(n, table[1][0])


def output_names(n: int) -> tuple[str, ...]:
    """Names of an op's ``n`` tensor results: ``output[0]``, ``output[1]``..."""
    return tuple(f"output[{i}]" for i in range(n))


ONE_OUTPUT = ("output",)
OUTPUT_NAMES = tuple(output_names(n) for n in range(9))


_positional_names: dict[type, tuple[tuple[str, ...], bool]] = {}


def forward_params(module: nn.Module) -> tuple[tuple[str, ...], bool]:
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


def flatten(obj: Any, name: str, out: list, names: list, depth: int = 0) -> None:
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
                flatten(item, f"{name}[{i}]", out, names, depth + 1)
    elif isinstance(obj, Mapping):
        for key, item in obj.items():
            flatten(item, f"{name}[{key!r}]", out, names, depth + 1)
