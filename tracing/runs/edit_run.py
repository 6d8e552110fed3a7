"""Run a model with edits and record nothing: the engine of patching sweeps.

:func:`tracing.trace` applies edits while it records every step, which costs what a trace
costs. A sweep runs the model hundreds of times and wants only the output, so
:func:`run_edited` instruments the addressed modules alone: a forward hook on a module
site; for an op site, hooks on that module and its submodules (to know when an op runs
directly in it) and a small torch function mode that is active only while that module
runs. The same :class:`~tracing.edits.EditPlan` decides what to change, so a site means
the same here as in a trace (op names and occurrences as the tracer counts them).

>>> edits = [Edit("blocks.1", Zero(), positions=3)]
>>> logits = run_edited(model, tokens, edits=edits)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from tracing.capture.edits import Edit, EditError, EditPlan
from tracing.capture.op_names import SKIP as _SKIP
from tracing.capture.op_names import classify as _classify


def _has_tensor(result: Any) -> bool:
    if isinstance(result, torch.Tensor):
        return True
    return isinstance(result, (tuple, list)) and any(isinstance(r, torch.Tensor) for r in result)


class _EditMode(TorchFunctionMode):
    """Edits op results while an op-site module is the innermost running one."""

    def __init__(self, plan: EditPlan, stack: list):
        super().__init__()
        self.plan = plan
        self.stack = stack  # (path, call) of running instrumented modules, innermost last

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.stack or self.stack[-1][0] not in self.plan.op_modules:
            return func(*args, **kwargs)
        path, call = self.stack[-1]
        name = _classify(func)
        if name in self.plan.call_names:  # an edit replaces the whole call
            return self.plan.on_call(path, call, name, func, args, kwargs)
        result = func(*args, **kwargs)
        if name is _SKIP or name not in self.plan.op_names or not _has_tensor(result):
            return result  # (ops without a tensor result make no step: not counted)
        inputs = [a for a in args if isinstance(a, torch.Tensor)]
        return self.plan.on_op(path, call, name, result, inputs=inputs)


class _Instruments:
    """Hooks on the modules a plan addresses (and an op site's submodules); removed by
    :meth:`remove`, also when the forward raised."""

    def __init__(self, model: nn.Module, plan: EditPlan):
        self.plan = plan
        self.calls: dict[str, int] = {}
        self.stack: list[tuple[str, int]] = []
        self.mode = _EditMode(plan, self.stack) if plan.op_names else None
        self.mode_depth = 0
        self.handles: list[Any] = []
        watched: dict[str, nn.Module] = {}
        for path, module in model.named_modules():
            inside_op_module = any(
                path == m or path.startswith(m + ".") or m == "" for m in plan.op_modules
            )
            if path in plan.module_paths or inside_op_module:
                watched[path] = module
        for path, module in watched.items():
            self.handles.append(module.register_forward_pre_hook(self._pre(path)))
            self.handles.append(module.register_forward_hook(self._post(path), always_call=True))

    def _pre(self, path: str):
        tracked = self.mode is not None
        op_module = path in self.plan.op_modules

        def pre(module, args):
            call = self.calls.get(path, 0)
            self.calls[path] = call + 1
            if tracked:
                self.stack.append((path, call))
                if op_module:
                    if self.mode_depth == 0:
                        self.mode.__enter__()
                    self.mode_depth += 1

        return pre

    def _post(self, path: str):
        tracked = self.mode is not None
        op_module = path in self.plan.op_modules
        module_site = path in self.plan.module_paths

        def post(module, args, output):
            call = self.calls.get(path, 1) - 1
            if tracked:
                if self.stack and self.stack[-1][0] == path:
                    call = self.stack.pop()[1]
                if op_module:
                    self.mode_depth -= 1
                    if self.mode_depth == 0:
                        self.mode.__exit__(None, None, None)
            if module_site:
                new = self.plan.on_module(path, call, output)
                return None if new is output else new
            return None

        return post

    def start(self) -> None:
        """Before the forward: a plan that replaces a call (``head=`` on an
        ``nn.MultiheadAttention``) needs the op mode throughout, so that no fast path
        (``nn.TransformerEncoderLayer``'s, the attention's own) runs around the call."""
        if self.mode is not None and self.plan.whole_run:
            self.mode.__enter__()
            self.mode_depth += 1

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        while self.mode_depth > 0:  # the forward raised inside an op-site module
            self.mode_depth -= 1
            if self.mode_depth == 0:
                self.mode.__exit__(None, None, None)


def run_edited(
    model: nn.Module,
    *args: Any,
    edits: EditPlan | Iterable[Edit | tuple],
    check: bool = True,
    **kwargs: Any,
) -> Any:
    """``model(*args, **kwargs)`` with ``edits`` applied; returns the model's output.

    Runs in the model's current mode and grad mode (wrap it in ``torch.no_grad()``). An
    edit that matched nothing raises :class:`~tracing.edits.EditError` (``check=False``
    leaves that to the caller, who can read ``plan.unmatched()``). Every hook is removed
    before it returns or raises.
    """
    plan = EditPlan.of(edits)
    plan.check_model(model)  # once per model: sorts the edits for it
    for _ in range(len(plan.edits) + 1):  # each pass readdresses one edit at least
        plan.reset()
        instruments = _Instruments(model, plan)
        try:
            instruments.start()
            output = model(*args, **kwargs)
            break
        except EditError as e:
            if getattr(e, "head_module", None) is None:
                raise
            instruments.remove()
            _resolve_heads(plan, model, args, kwargs, e)  # or raise, naming the sites
        finally:
            instruments.remove()
    if check:
        plan.check_matched()
    return output


def _resolve_heads(plan: EditPlan, model: nn.Module, args: tuple, kwargs: dict, error) -> None:
    """``head=`` on a module whose output has no heads axis (an attention module): find
    the per-head output inside it in one ``shapes`` trace and readdress the edit there
    (:meth:`EditPlan.resolve_heads`; the plan keeps it, so a plan reused on this model
    pays once). Raises the edit's error, naming the sites that would work, when that
    trace shows none there, or several."""
    from tracing.capture.tracer import trace

    try:
        with torch.no_grad(), torch.random.fork_rng(devices=_cuda_devices(model)):
            structure = trace(model, *args, capture="shapes", **kwargs)
    except Exception:  # the model cannot be traced: the edit's own error is what matters
        raise error from None
    if plan.resolve_heads(structure, error.head_module):
        return
    from tracing.capture.heads import head_site_hint

    raise EditError(f"{error}{head_site_hint(structure, error.head_module)}") from None


def _cuda_devices(model: nn.Module) -> list[int]:
    """The CUDA devices the model's parameters are on (whose random state a second run
    must not move on)."""
    return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})


__all__ = ["run_edited"]
