"""The recorders: what runs on every op and every module call while a trace records.

:class:`OpMode` (a ``TorchFunctionMode``) hands each torch call to the closure made by
:func:`_op_recorder`; the forward wrappers call the pair made by
:func:`module_recorder`. Both only record; behaviour belongs in the
:class:`~tracing.capture.tracer.Tracer` methods they call.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from tracing.attention_flow import MIXES, SOFTMAXES
from tracing.capture.drafts import StepDraft
from tracing.capture.frames import Frame, ModuleSpec
from tracing.capture.op_names import (
    FUNCTIONAL_COLLECTIVES,
    ONE_OUTPUT,
    OUTPUT_NAMES,
    SKIP,
    classify,
    flatten,
    func_info,
    output_names,
)
from tracing.capture.source import caller_location

if TYPE_CHECKING:  # pragma: no cover
    from tracing.capture.tracer import Tracer

_Tensor = torch.Tensor


# --------------------------------------------------------------------------- the recorders


class OpMode(TorchFunctionMode):
    """Records torch calls made while a traced module runs (popped while it records)."""

    def __init__(self, tracer: Tracer):
        super().__init__()
        self.stack = tracer._stack  # open module calls: no module running, nothing to record
        self.record = _op_recorder(tracer)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # The hottest function of a trace: one dict lookup decides, no kwargs copy.
        try:
            name = func_info[func]
        except (KeyError, TypeError):  # first call of this func, or an unhashable one
            name = classify(func)
        if name is SKIP or not self.stack:
            return func(*args, **kwargs) if kwargs else func(*args)
        return self.record(func, name, args, kwargs)


# Ops that may make an attention map, or prove one (a contraction of a softmax with the
# values): see Tracer._attention_op and tracing.attention_flow.
_ATTENTION_OPS = (
    SOFTMAXES | MIXES | {"scaled_dot_product_attention", "multi_head_attention_forward"}
)
COLLECTIVE_OPS = FUNCTIONAL_COLLECTIVES  # their group is noted
NOTED_OPS = _ATTENTION_OPS | COLLECTIVE_OPS  # ops that _op_done looks at more closely


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
        return (result,), ONE_OUTPUT
    if isinstance(result, (tuple, list)):
        outs = tuple([r for r in result if isinstance(r, _Tensor)])
    elif result is None and tensors and tensors[0]._version != version:
        outs = (tensors[0],)
    else:
        return (), ()
    n = len(outs)
    return outs, OUTPUT_NAMES[n] if n < len(OUTPUT_NAMES) else output_names(n)


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
    call_names = tracer._edits.call_names if tracer._edits is not None else frozenset()

    noted = NOTED_OPS if tracer._breaker is None else None  # else every op is looked at

    def record(func, name, args, kwargs):
        tensors = _tensor_args(args, kwargs)
        known = len(records)
        if len(tensors) == 1:  # most ops: no list comprehension (a call of its own)
            in_ids = [tensor_id(tensors[0], None)]
        else:
            in_ids = [tensor_id(t, None) for t in tensors]
        version = tensors[0]._version if tensors else 0
        try:
            if name in call_names:  # an edit replaces the whole call (tracing.edits)
                result = tracer._edit_call(func, name, args, kwargs)
            else:
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
        if len(outs) == 1:
            step.outputs = [tensor_id(outs[0], index, None, pair)]
        else:
            step.outputs = [tensor_id(t, index, None, pair) for t in outs]
        if noted is None or name in noted:
            op_done(index, name, func, args, kwargs, outs)
        return result

    return record


def _module_inputs(spec: ModuleSpec, args: tuple, kwargs: dict) -> tuple[Any, tuple[str, ...]]:
    """A module call's input tensors and their names: by the forward's parameter names
    (``q``, ``k``, ``mask``), ``args[i]`` past them, keyword names, ``x[0]`` inside a
    list or dict."""
    pos_names = spec.positional
    n = len(args)
    if not kwargs and n <= len(pos_names) and all([isinstance(a, _Tensor) for a in args]):
        return args, pos_names[:n]  # the common call, tensors by position
    tensors: list = []
    names: list = []
    for i, arg in enumerate(args):
        flatten(arg, pos_names[i] if i < len(pos_names) else f"args[{i}]", tensors, names)
    for key, arg in kwargs.items():
        flatten(arg, key, tensors, names)
    return tensors, tuple(names)


def _module_outputs(output: Any) -> tuple[Any, tuple[str, ...]]:
    """A module's output tensors and their names: ``output``, ``output[1]``,
    ``output['logits']``."""
    if isinstance(output, _Tensor):
        return (output,), ONE_OUTPUT
    tensors: list = []
    names: list = []
    flatten(output, "output", tensors, names)
    return tensors, tuple(names)


def module_recorder(tracer: Tracer):
    """The functions that open and close a module step for ``tracer``: ``enter(spec,
    module, args, kwargs) -> frame`` and ``leave(frame, output)``, called by the forward
    wrappers (or hooks) around every module call. Closures, like :func:`_op_recorder`.

    A frame is a :class:`~tracing.capture.frames.Frame` (step index, module, source for its
    ops or None, path): ops inside torch's own modules (``nn.Linear``...) take the module
    step's source line, since every frame between is torch code, so their frame walk is
    skipped.
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
            parent, depth = stack[-1].index, len(stack)
        else:
            parent, depth = None, 0
            tracer._root_inputs(ids, names, tensors)
            tracer._root_call = tracer._root_call or (args, kwargs)
        steps.append(
            StepDraft("module", path, type_name, source, ids, (), names, (), depth, parent, call)
        )
        frame = Frame(index, module, source if torch_module else None, path)
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
        index = frame.index
        step = steps[index]
        step.end = len(steps) - 1
        if frame.path in edit_paths:  # edits (tracing.edits) replace the output first
            output = edits.on_module(frame.path, step.call, output, index)
        tensors, step.output_names = _module_outputs(output)
        step.outputs = [tensor_id(t, index) for t in tensors]
        if not stack:
            tracer.output = output
        tracer._module_done(frame, tensors)
        return output

    return enter, leave
