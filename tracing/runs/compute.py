"""Where the compute of a forward goes: mult-adds and parameters per module, from torchinfo.

:func:`module_compute` runs ``torchinfo.summary`` once per model and input shape (cached)
and turns its rows into one :class:`ModuleCompute` per module path: the mult-adds of the
module's whole subtree (the sum over the leaf modules inside it, each call counted) and its
parameter count. The root's figures are ``summary.total_mult_adds`` and
``summary.total_params`` exactly (``tests/test_compute.py`` holds it).

The summary runs on the **meta device** where the model allows: parameters, buffers and
inputs are swapped for meta tensors of the same shapes (``torch.func.functional_call``), so
no weight is copied and no arithmetic is done; a model that cannot run on meta (a
data-dependent branch, ``.item()``) is summarised on its own device under ``no_grad``.

What torchinfo counts, and so what these figures are: for each *leaf* module, its
parameters times the first dimension of its output (``Conv``: times the output's spatial
size). Work done by bare tensor ops (an attention's ``q @ k.T``, a softmax) is not a
parameter's and is not in them; the app says so where it shows them.

:func:`attach` stores the result in ``trace.meta["compute"]`` (``{path: [mult_adds,
params]}``, plus ``"device"`` and ``"source"``), so a saved trace keeps it and the report
and the app read it without the model (:func:`tracing.analysis.compute.compute_of`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from tracing.record import Trace


@dataclass(frozen=True)
class ModuleCompute:
    path: str
    mult_adds: int  # the subtree's, every call counted
    params: int  # the subtree's, as torchinfo counts them


@dataclass(frozen=True)
class ComputeSummary:
    modules: dict[str, ModuleCompute]
    total_mult_adds: int  # == torchinfo.summary(...).total_mult_adds
    total_params: int  # == torchinfo.summary(...).total_params
    device: str  # "meta" or the model's own device

    def to_meta(self) -> dict[str, Any]:
        return {
            "source": "torchinfo",
            "device": self.device,
            "total_mult_adds": self.total_mult_adds,
            "total_params": self.total_params,
            "modules": {p: [m.mult_adds, m.params] for p, m in self.modules.items()},
        }


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {shapes: summary}


def _shape_key(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), str(x.dtype))
    if isinstance(x, (list, tuple)):
        return tuple(_shape_key(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _shape_key(v)) for k, v in x.items()))
    return repr(type(x))


def _to_meta(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return torch.empty_like(x, device="meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_to_meta(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_meta(v) for k, v in x.items()}
    return x


def _summary(model: nn.Module, args: tuple, kwargs: dict, meta: bool):
    import torchinfo
    from torch import nn
    from torch.func import functional_call

    if not meta:
        return torchinfo.summary(
            model, input_data=list(args), verbose=0, mode="train" if model.training else "eval",
            **kwargs,
        )  # fmt: skip
    state = {k: _to_meta(v) for k, v in model.named_parameters()}
    state.update({k: _to_meta(v) for k, v in model.named_buffers()})

    class OnMeta(nn.Module):
        """Calls the model with meta parameters and buffers: torchinfo's hooks still fire
        on the model's own modules, and their parameters keep their shapes."""

        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, *a, **k):
            return functional_call(self.inner, state, a, k)

    wrapper = OnMeta()
    wrapper.train(model.training)
    return torchinfo.summary(
        wrapper,
        input_data=list(_to_meta(args)),
        verbose=0,
        mode="train" if model.training else "eval",
        **_to_meta(kwargs),
    )


def module_compute(model: nn.Module, *args: Any, **kwargs: Any) -> ComputeSummary:
    """Mult-adds and parameters per module path of ``model`` on these inputs (cached per
    model and input shapes); on the meta device where the model allows."""
    key = (_shape_key(args), _shape_key(kwargs))
    per_model = _CACHE.setdefault(model, {})
    cached = per_model.get(key)
    if cached is not None:
        return cached
    training = model.training
    try:
        try:
            stats, device = _summary(model, args, kwargs, meta=True), "meta"
        except Exception:  # the model does not run on meta: its own device, no grad
            stats = _summary(model, args, kwargs, meta=False)
            first = next(model.parameters(), None)
            device = str(first.device) if first is not None else "cpu"
    finally:
        model.train(training)
    paths = {id(m): p for p, m in model.named_modules()}
    leaf: dict[str, int] = {}
    params: dict[str, int] = {}
    for row in stats.summary_list:
        path = paths.get(id(row.module))
        if path is None:  # the meta wrapper
            continue
        if row.is_leaf_layer:
            leaf[path] = leaf.get(path, 0) + int(row.macs)
        params.setdefault(path, int(row.num_params))
    totals: dict[str, int] = {}
    for path, macs in leaf.items():
        parts = path.split(".") if path else []
        for k in range(len(parts) + 1):
            prefix = ".".join(parts[:k])
            totals[prefix] = totals.get(prefix, 0) + macs
    modules = {
        p: ModuleCompute(p, totals.get(p, 0), params.get(p, 0))
        for p in paths.values()
        if p in params or p in totals
    }
    root = modules.get("")
    if root is not None:  # the root's are torchinfo's totals, whatever sharing did above
        modules[""] = ModuleCompute("", int(stats.total_mult_adds), int(stats.total_params))
    summary = ComputeSummary(modules, int(stats.total_mult_adds), int(stats.total_params), device)
    per_model[key] = summary
    return summary


def attach(trace: Trace, model: nn.Module, *args: Any, **kwargs: Any) -> str | None:
    """Put :func:`module_compute` into ``trace.meta["compute"]``; returns why not (the
    summary raised), or None when it is there."""
    try:
        summary = module_compute(model, *args, **kwargs)
    except Exception as e:  # the figures are extra: a model torchinfo cannot run keeps its trace
        return f"{type(e).__name__}: {e}"
    trace.meta["compute"] = summary.to_meta()
    return None


__all__ = ["ComputeSummary", "ModuleCompute", "attach", "module_compute"]
