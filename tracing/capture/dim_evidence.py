"""Which axes move with the inputs: a second, cheap pass at other input sizes.

Two axes of size 16 look alike in one trace, the head width and 16 tokens. They are told
apart by running the model again with other input sizes — the batch ``B`` and the tokens
``T`` changed to sizes no config size matches — and seeing which axes moved with them:
``T`` moves with T, ``B·T`` with both, ``T+1`` by T's step, the head width not at all.
A small model (weights up to :data:`SMALL_MODEL_BYTES`) runs for real at the other sizes,
in eval mode, its random state and tensor attributes put back after; a larger one on the
``meta`` device (parameters swapped for shape-only twins in place and put back: no
arithmetic, no memory). Either way it runs under a shapes-only tracer, and
its steps are aligned with the real trace's step by step (same module, same op; where a
model's steps differ, as a mixture of experts' do, :class:`difflib.SequenceMatcher` pairs
what matches). A model the meta device cannot run (``.item()``, ``nonzero``...) runs once
more for real at the other sizes, in eval mode only; one that cannot run at all keeps what
the rest of the evidence proves, and ``trace.meta["notes"]`` says so. The pass is cached
per model and input signature.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tracing.errors import TraceError
from tracing.record import Step, TensorRecord

_IN_PASS = contextvars.ContextVar("scratchformer_dims_pass", default=False)
ENABLED = True
"""Set to ``False`` to trace without the second pass (names then rest on the other evidence)."""

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {signature: Other}
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device)


@dataclass
class Other:
    """The second pass, as much as the naming needs: its sizes and its steps' shapes."""

    b: int
    t: int
    how: str  # "meta" or "device"
    steps: list[Step]
    shapes: list[tuple[int, ...]]  # per tensor id of that pass
    seconds: float
    meta_failed: str | None = None  # why the meta device could not run it ("device" passes)
    partial: str | None = None  # the pass raised here, after its steps (a failing forward)


def in_pass() -> bool:
    """True while the second pass runs (its tracer must not start a third)."""
    return _IN_PASS.get()


# --------------------------------------------------------------------------- sizes


def other_sizes(b: int, t: int, constants: set[int], max_t: int | None) -> tuple[int, int]:
    """``B'`` and ``T'`` for the pass: near ``b`` and ``t`` (fewer tokens where there are
    enough: a model may refuse more than it was given), equal to no config size, and with
    a step in T that divides no config size (so ``k·B`` and ``T+c`` never predict the
    same sizes)."""
    taken = set(constants) | {b, t}
    b2 = next(n for n in range(b + 1, b + 64) if n not in taken)
    for step in (-5, -7, -3, -2, -1, 5, 7, 3, 11, 13, 2, 1):  # fewer tokens first: cheaper
        t2 = t + step
        if t2 < 2 or (max_t is not None and t2 > max_t) or t2 in taken | {b2}:
            continue
        if abs(step) > 2 and any(c % abs(step) == 0 for c in constants):
            continue
        return b2, t2
    return b2, t + 1


def _resize(x: Any, b: int, t: int, b2: int, t2: int, meta: bool, depth: int = 0) -> Any:
    """``x`` with each axis of size ``b`` (axis 0) or ``t`` (later axes, or a 1-D tensor)
    resized; on ``meta`` as an empty tensor, else by repeating the real values (so token
    ids stay valid ids). Containers are walked; other objects are returned as they are."""
    if isinstance(x, torch.Tensor):
        new = list(x.shape)
        for axis, size in enumerate(x.shape):
            if x.dim() == 1:
                new[0] = t2 if size == t else b2 if size == b else size
            elif axis == 0 and size == b:
                new[0] = b2
            elif axis > 0 and size == t:
                new[axis] = t2
        if meta:
            return torch.empty(new, dtype=x.dtype, device="meta")
        out = x
        for axis, (old, size) in enumerate(zip(x.shape, new)):
            if old != size:
                index = torch.arange(size, device=x.device) % old
                out = out.index_select(axis, index)
        return out
    if depth > 3:
        return x
    if isinstance(x, tuple | list):
        return type(x)(_resize(v, b, t, b2, t2, meta, depth + 1) for v in x)
    if isinstance(x, dict):
        return {k: _resize(v, b, t, b2, t2, meta, depth + 1) for k, v in x.items()}
    return x


def _foreign(x: Any, depth: int = 0) -> str | None:
    """The type name of an input the pass could change (a cache object), else None."""
    if isinstance(x, (torch.Tensor, *_PLAIN)) or depth > 3:
        return None
    if isinstance(x, tuple | list):
        return next((f for v in x if (f := _foreign(v, depth + 1))), None)
    if isinstance(x, dict):
        return next((f for v in x.values() if (f := _foreign(v, depth + 1))), None)
    return type(x).__name__


def signature(args: Any, kwargs: Mapping, train: bool) -> tuple:
    """A hashable key of the call's input kinds and shapes (values do not matter)."""

    def sig(x, depth=0):
        if isinstance(x, torch.Tensor):
            return ("T", tuple(x.shape), str(x.dtype))
        if isinstance(x, tuple | list) and depth < 4:
            return tuple(sig(v, depth + 1) for v in x)
        if isinstance(x, dict) and depth < 4:
            return tuple((k, sig(v, depth + 1)) for k, v in sorted(x.items(), key=str))
        return repr(x) if isinstance(x, _PLAIN) else type(x).__name__

    return (sig(tuple(args)), sig(dict(kwargs)), train)


# --------------------------------------------------------------------------- the pass


def run_other(
    model: torch.nn.Module,
    call: tuple[tuple, dict],
    b: int,
    t: int,
    constants: set[int],
    max_t: int | None,
    train: bool,
    ops: bool,
) -> tuple[Other | None, str | None]:
    """The second pass (cached), or ``None`` and why it could not run."""
    args, kwargs = call
    foreign = _foreign((args, kwargs))
    if foreign is not None:
        return None, f"an input is a {foreign}, which a second pass could change"
    key = signature(args, kwargs, train)
    per_model = _CACHE.setdefault(model, {})
    if key in per_model:
        return per_model[key], None
    b2, t2 = other_sizes(b, t, constants, max_t)
    started = time.perf_counter()
    if not train and _small_enough_to_run(model):
        # a small model runs for real faster than on meta (whose every op is Python)
        other, why = _on_device(model, args, kwargs, (b, t, b2, t2), ops)
        if other is not None and not other.partial:
            other.seconds = round(time.perf_counter() - started, 6)
            per_model[key] = other
            return other, None
    other, why = _on_meta(model, args, kwargs, (b, t, b2, t2), train, ops)
    if (other is None or other.partial) and not train:
        real, why2 = _on_device(model, args, kwargs, (b, t, b2, t2), ops)
        if real is not None and (other is None or len(real.steps) > len(other.steps)):
            real.meta_failed = why or other.partial
            other, why = real, None
        elif other is None:
            why = f"{why}; on the device: {why2}"
    if other is None:
        return None, why
    other.seconds = round(time.perf_counter() - started, 6)
    if len(per_model) > 8:
        per_model.clear()
    per_model[key] = other
    return other, None


def _traced(model, run, b2: int, t2: int, how: str, train: bool, ops: bool) -> Other:
    from tracing.capture.tracer import Tracer

    token = _IN_PASS.set(True)
    try:
        tracer = Tracer(model, "shapes", train=train, ops=ops)
        try:
            with _user_hooks_off(model), torch.no_grad(), tracer:
                run()
        except TraceError as e:  # a forward that raises: its steps up to there still count
            if not (e.trace and e.trace.steps):
                raise
            partial = f"{e.__cause__ or e}"[:200]
        else:
            partial = None
    finally:
        _IN_PASS.reset(token)
    trace = tracer.trace
    shapes = [r.shape for r in trace.tensors]
    return Other(b2, t2, how, list(trace.steps), shapes, 0.0, partial=partial)


def _on_meta(model, args, kwargs, sizes, train, ops) -> tuple[Other | None, str | None]:
    b, t, b2, t2 = sizes
    saved = _snapshot(model)
    try:
        margs = _resize(args, b, t, b2, t2, meta=True)
        mkwargs = _resize(kwargs, b, t, b2, t2, meta=True)
        with _on_meta_device(model):
            other = _traced(model, lambda: model(*margs, **mkwargs), b2, t2, "meta", train, ops)
        return other, None
    except Exception as e:
        return None, _reason(e)
    finally:
        _restore(saved)


@contextlib.contextmanager
def _on_meta_device(model):
    """Every parameter and buffer swapped for a shape-only twin on the ``meta`` device, in
    place, and put back after. Tied weights stay tied (one twin per tensor), and a module
    registered under two names (a ``ModuleDict`` that aliases a ``Sequential``) is swapped
    once. (``torch.func.functional_call`` left such a model with meta weights after the
    pass: ``Experts`` in tests/tracing/test_nonfinite_origin.py.)"""
    twins: dict[int, torch.Tensor] = {}
    swapped = []
    seen: set[int] = set()
    for module in model.modules():
        if id(module) in seen:
            continue
        seen.add(id(module))
        for table in (module._parameters, module._buffers):
            for name, value in table.items():
                if value is None:
                    continue
                twin = twins.get(id(value))
                if twin is None:
                    twin = torch.empty_like(value, device="meta")
                    if isinstance(value, torch.nn.Parameter):
                        twin = torch.nn.Parameter(twin, requires_grad=value.requires_grad)
                    twins[id(value)] = twin
                swapped.append((table, name, value))
                table[name] = twin
    try:
        yield
    finally:
        for table, name, value in swapped:
            table[name] = value


SMALL_MODEL_BYTES = 64 * 2**20
"""Weights and buffers up to this size: the second pass runs for real, on the model's own
device, before trying ``meta`` (on meta every op goes through Python; a small model's real
ops are faster, as ``scratchformer bench`` shows for a 50,000-op loop)."""


def _small_enough_to_run(model) -> bool:
    total = 0
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.is_meta:
            return False
        total += tensor.numel() * tensor.element_size()
        if total > SMALL_MODEL_BYTES:
            return False
    return True


def _on_device(model, args, kwargs, sizes, ops) -> tuple[Other | None, str | None]:
    b, t, b2, t2 = sizes
    saved = _snapshot(model)
    rng = torch.random.get_rng_state()  # a forward that draws must not move the user's RNG
    try:
        rargs = _resize(args, b, t, b2, t2, meta=False)
        rkwargs = _resize(kwargs, b, t, b2, t2, meta=False)
        return _traced(model, lambda: model(*rargs, **rkwargs), b2, t2, "device", False, ops), None
    except Exception as e:
        return None, _reason(e)
    finally:
        torch.random.set_rng_state(rng)
        _restore(saved)


_HOOK_DICTS = (
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs",
)  # fmt: skip


@contextlib.contextmanager
def _user_hooks_off(model):
    """The user's forward hooks do not see the second pass: it is ours, at sizes they
    never asked for (a hook that logs or counts calls would see a phantom call)."""
    saved = []
    for module in model.modules():
        for name in _HOOK_DICTS:
            hooks = module.__dict__.get(name)
            if hooks:
                saved.append((module, name, hooks))
                module.__dict__[name] = type(hooks)()
    try:
        yield
    finally:
        for module, name, hooks in saved:
            module.__dict__[name] = hooks


def _reason(e: BaseException) -> str:
    cause = e.__cause__ or e
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0][:120] if text else ''}".rstrip(": ")


def _snapshot(model) -> list[tuple[Any, dict]]:
    """Every module's tensor attributes and buffers, so a forward that stores a computed
    tensor on a module (a rotary cache) leaves the model as it was."""
    saved = []
    for module in model.modules():
        mine = {k: v for k, v in vars(module).items() if isinstance(v, torch.Tensor)}
        saved.append((module, mine, dict(module._buffers)))
    return saved


def _restore(saved) -> None:
    for module, attrs, buffers in saved:
        for name in [k for k, v in vars(module).items() if isinstance(v, torch.Tensor)]:
            if name not in attrs:
                with contextlib.suppress(AttributeError):
                    delattr(module, name)
        for name, value in attrs.items():
            module.__dict__[name] = value
        for name in [k for k in module._buffers if k not in buffers]:
            del module._buffers[name]
        module._buffers.update(buffers)


# --------------------------------------------------------------------------- alignment


def _key(step: Step) -> tuple:
    return (step.kind, step.module, step.op, len(step.inputs), len(step.outputs))


def align(
    steps: Sequence[Step], tensors: Sequence[TensorRecord], other: Other
) -> list[tuple[int, ...] | None]:
    """Per tensor of the real trace, its shape in the other pass (``None``: not matched).

    Steps pair up where module, op and arity agree (all of them, in order, for a model
    whose steps do not depend on its data); their inputs and outputs pair by position.
    """
    mine = [_key(s) for s in steps]
    theirs = [_key(s) for s in other.steps]
    if mine == theirs:
        pairs = list(zip(range(len(mine)), range(len(mine))))
    else:
        matcher = difflib.SequenceMatcher(None, mine, theirs, autojunk=False)
        pairs = [(a + k, b + k) for a, b, n in matcher.get_matching_blocks() for k in range(n)]
    out: list[tuple[int, ...] | None] = [None] * len(tensors)
    for a, b in pairs:
        sa, sb = steps[a], other.steps[b]
        for ra, rb in zip((*sa.outputs, *sa.inputs), (*sb.outputs, *sb.inputs)):
            if out[ra] is None and rb < len(other.shapes):
                shape = other.shapes[rb]
                if len(shape) == len(tensors[ra].shape):
                    out[ra] = shape
    return out
