"""Which axes move with the inputs: a second, cheap pass at other input sizes.

Two axes of size 16 look alike in one trace, the head width and 16 tokens. They are told
apart by running the model again with other input sizes — the batch ``B`` and the tokens
``T`` changed to sizes no config size matches — and seeing which axes moved with them:
``T`` moves with T, ``B·T`` with both, ``T+1`` by T's step, the head width not at all.
A small model (weights up to :data:`SMALL_MODEL_BYTES`) runs for real at the other sizes,
in eval mode, its random state and tensor attributes put back after; a larger one on the
``meta`` device (parameters swapped for shape-only twins in place and put back: no
arithmetic, no memory). Either way it runs under a shapes-only tracer, and
its steps are paired with the real trace's by :mod:`tracing.dims.align` (same module,
same op, same occurrence: linear in the steps). A model the meta device cannot run
(``.item()``, ``nonzero``...) runs once
more for real at the other sizes, in eval mode only; one that cannot run at all keeps what
the rest of the evidence proves, and ``trace.meta["notes"]`` says so. The pass is cached
per model and input signature.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import functools
import logging
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from tracing.dims.letters import text_config
from tracing.errors import TraceError
from tracing.record import Step

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
    twin: Any = None  # a knob pass's rebuilt model (its layer shapes give letter sizes)
    cut: tuple[str, int] | None = None  # stopped at this layer of this stack: repeats after


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
    if t < 0:  # no time axis (an image): the batch alone moves
        return b2, t
    for step in (-5, -7, -3, -2, -1, 5, 7, 3, 11, 13, 2, 1):  # fewer tokens first: cheaper
        t2 = t + step
        if t2 < 2 or (max_t is not None and t2 > max_t) or t2 in taken | {b2}:
            continue
        if abs(step) > 2 and any(c % abs(step) == 0 for c in constants):
            continue
        return b2, t2
    return b2, t + 1


def few_tokens(b2: int, t: int, constants: set[int], max_t: int | None) -> int | None:
    """A small ``T'`` (at most 16, fewer than ``t``, beside :func:`other_sizes`' ``B'``)
    equal to no config size, for a short real run; ``None`` when ``t`` is already small or
    no such size is free."""
    if t <= 20:
        return None
    taken = set(constants) | {t, b2}
    for t2 in (11, 13, 9, 14, 15, 10, 7):
        free = t2 not in taken and (max_t is None or t2 <= max_t)
        if free and not any(c % (t - t2) == 0 for c in constants if c > 0):
            return t2
    return None


FEW_TOKENS_BUDGET = 4e9
"""Parameters × B' × T' up to this (about the multiply-adds of the short run): run it for
real; a larger model's pass runs on ``meta``."""


def _cheap_at(model, b2: int, t2: int) -> bool:
    total = 0
    for tensor in model.parameters():
        if tensor.is_meta:
            return False
        total += tensor.numel()
    return total * b2 * t2 <= FEW_TOKENS_BUDGET


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
    shapes_pass: ShapesPass,
) -> tuple[Other | None, str | None]:
    """The inputs pass (cached), or ``None`` and why it could not run."""
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
    t_few = few_tokens(b2, t, constants, max_t) if not train else None
    few = None if t_few is None else (b2, t_few)
    if few is not None and _cheap_at(model, *few):
        # a short run for real: a handful of tokens costs less than meta's Python per op
        # (and meta's first ops import torch._dynamo); the same steps where T is free. It
        # stops where its layer stack only repeats layers it has run (repeat_cut)
        cut = repeat_cut(model)
        other, why = _on_device(model, args, kwargs, (b, t, *few), ops, shapes_pass, cut)
        if other is not None and not other.partial:
            other.seconds = round(time.perf_counter() - started, 6)
            per_model[key] = other
            return other, None
    if not train and _small_enough_to_run(model):
        # a small model runs for real faster than on meta (whose every op is Python)
        other, why = _on_device(model, args, kwargs, (b, t, b2, t2), ops, shapes_pass)
        if other is not None and not other.partial:
            other.seconds = round(time.perf_counter() - started, 6)
            per_model[key] = other
            return other, None
    other, why = _on_meta(model, args, kwargs, (b, t, b2, t2), train, ops, shapes_pass)
    if (other is None or other.partial) and not train:
        real, why2 = _on_device(model, args, kwargs, (b, t, b2, t2), ops, shapes_pass)
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


ShapesPass = Callable[[Any, Callable[[], Any], bool, bool], tuple[list[Step], list, None]]
"""The tracer's shapes-only run, handed in by the tracer (``tracing.dims`` never imports
it): ``(model, run, train, ops) -> (steps, shapes per tensor id)``; a forward that raises
part-way raises :class:`~tracing.errors.TraceError` with the trace so far."""


def _traced(
    model, run, b2: int, t2: int, how: str, train: bool, ops: bool, shapes_pass, cut=None
) -> Other:
    token = _IN_PASS.set(True)
    partial = None
    try:
        try:
            with _user_hooks_off(model), _stop_at(model, cut), torch.no_grad():
                steps, shapes = shapes_pass(model, run, train, ops)
            cut = None  # the stack was not reached (another path): the whole forward ran
        except TraceError as e:  # a forward that raises: its steps up to there still count
            if not (e.trace and e.trace.steps):
                raise
            if not isinstance(e.__cause__ or e, RepeatsFollow):
                partial, cut = f"{e.__cause__ or e}"[:200], None
            steps, shapes = list(e.trace.steps), [r.shape for r in e.trace.tensors]
    finally:
        _IN_PASS.reset(token)
    return Other(b2, t2, how, steps, shapes, 0.0, partial=partial, cut=cut)


# --------------------------------------------------------------------------- repeats


class RepeatsFollow(Exception):
    """Raised by the inputs pass as it enters the layer of a stack from which every layer
    repeats one it has run: their steps' shapes are those of the layer before
    (:func:`tracing.dims.align.fill_repeats`), so running them again proves nothing new."""


def repeat_cut(model: torch.nn.Module) -> tuple[str, int] | None:
    """``(stack's path, index)``: the layer of the model's longest stack (a ``ModuleList``
    or ``Sequential`` of three or more) where the inputs pass may stop. Every kind of layer
    in the stack has run once before it, and the last kind twice (the layer before the cut
    is the model for every layer after it). A layer's kind is its classes, parameter shapes
    and plain attributes (a sliding-window layer is not a full one), less an attribute that
    numbers the layers (``layer_idx``: another value in every layer). ``None``: no stack
    saves a layer. Only for a forward that ends with its stack's output (the head's steps
    after it are named from the ops)."""
    best = None
    for path, stack in model.named_modules():
        if not isinstance(stack, torch.nn.ModuleList | torch.nn.Sequential) or len(stack) < 3:
            continue
        kinds = _layer_kinds(list(stack))
        if kinds is None:
            continue
        last_new = max(kinds.index(k) for k in kinds)
        cut = last_new + 2
        if cut < len(stack) and (best is None or len(stack) - cut > best[2]):
            best = (path, cut, len(stack) - cut)
    return None if best is None else best[:2]


def _layer_kinds(layers: list) -> list | None:
    described = []
    for layer in layers:
        if not isinstance(layer, torch.nn.Module) or next(layer.parameters(), None) is None:
            return None  # a stack of functions or of parameter-free modules: no layers
        attrs = {}
        for name, module in layer.named_modules():
            for key, value in vars(module).items():
                if not key.startswith("_") and isinstance(value, int | float | str | bool):
                    attrs[(name, key)] = value
        params = tuple((n, tuple(p.shape), p.dtype) for n, p in layer.named_parameters())
        classes = tuple(type(m).__qualname__ for m in layer.modules())
        described.append((attrs, classes, params))
    counters = {  # an attribute with another value in every layer numbers them
        key for key in described[0][0] if len({d[0].get(key) for d in described}) == len(described)
    }
    return [
        (tuple(sorted((k, v) for k, v in a.items() if k not in counters)), c, p)
        for a, c, p in described
    ]


@contextlib.contextmanager
def _stop_at(model, cut: tuple[str, int] | None):
    """The inputs pass stopped as it enters layer ``cut``."""
    if cut is None:
        yield
        return

    def stop(module, args):
        raise RepeatsFollow(f"{cut[0]}.{cut[1]}")

    handle = model.get_submodule(cut[0])[cut[1]].register_forward_pre_hook(stop)
    try:
        yield
    finally:
        handle.remove()


def _on_meta(
    model, args, kwargs, sizes, train, ops, shapes_pass
) -> tuple[Other | None, str | None]:
    b, t, b2, t2 = sizes
    saved = _snapshot(model)
    try:
        margs = _resize(args, b, t, b2, t2, meta=True)
        mkwargs = _resize(kwargs, b, t, b2, t2, meta=True)
        with _on_meta_device(model):
            run = lambda: model(*margs, **mkwargs)  # noqa: E731
            other = _traced(model, run, b2, t2, "meta", train, ops, shapes_pass)
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


def _on_device(
    model, args, kwargs, sizes, ops, shapes_pass, cut=None
) -> tuple[Other | None, str | None]:
    b, t, b2, t2 = sizes
    saved = _snapshot(model)
    rng = torch.random.get_rng_state()  # a forward that draws must not move the user's RNG
    try:
        rargs = _resize(args, b, t, b2, t2, meta=False)
        rkwargs = _resize(kwargs, b, t, b2, t2, meta=False)
        run = lambda: model(*rargs, **rkwargs)  # noqa: E731
        return _traced(model, run, b2, t2, "device", False, ops, shapes_pass, cut), None
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


# --------------------------------------------------------------------------- knob passes


def with_knob(config: Any, knob: str, value: int) -> Any:
    """A copy of ``config`` with one size knob set: a dataclass is replaced, a Hugging Face
    config (or any object) deep-copied and set, a dict copied."""
    if isinstance(config, Mapping):
        return {**config, knob: value}
    if _is_field(config, knob):
        try:  # a dataclass derives its other fields again (head_dim from hidden_size)
            return dataclasses.replace(config, **{knob: value})
        except Exception:  # its own checks refuse a config built, then shrunk
            pass  # (layer_types of 48 layers beside 2): set the one field, as for any object
    twin = copy.deepcopy(config)
    owner = twin if _stores(twin, knob) else _text_part(twin)
    setattr(owner if owner is not None else twin, knob, value)
    return twin


def _is_field(config: Any, knob: str) -> bool:
    return (
        dataclasses.is_dataclass(config)
        and not isinstance(config, type)
        and knob in {f.name for f in dataclasses.fields(config)}
    )


def _stores(config: Any, knob: str) -> bool:
    """A size the config keeps (a dataclass field or an instance attribute)."""
    if _is_field(config, knob):
        return True
    try:
        return knob in vars(config)
    except TypeError:
        return False


def _text_part(config: Any) -> Any:
    """The decoder's own config of a composite one (:func:`tracing.dims.letters.text_config`),
    if it is another object; else ``None``."""
    text = text_config(config)
    return None if text is config else text


def read_knob(config: Any, knob: str) -> int | None:
    """``config.knob`` (or its text part's) as an int size, or ``None`` (absent, not an
    int, or refused)."""
    try:
        value = config.get(knob) if isinstance(config, Mapping) else getattr(config, knob, None)
        if value is None and not isinstance(config, Mapping):
            text = _text_part(config)
            value = getattr(text, knob, None) if text is not None else None
    except Exception:  # a config's own refusal (a per-layer attribute)
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def settable(config: Any, knob: str) -> bool:
    """Whether ``knob`` is a size the config stores (a dataclass field, a dict key, an
    instance attribute), not one it derives (a property such as ``d_head = C // H``)."""
    if isinstance(config, Mapping):
        return knob in config
    text = _text_part(config)
    return _stores(config, knob) or (text is not None and _stores(text, knob))


def knob_values(value: int) -> list[int]:
    """Other values to try for a knob of ``value``, most telling first: twice it (a ratio
    stays a ratio), three times, half, one more. A model's own checks (``C % H``) refuse
    some."""
    half = value // 2 if value % 2 == 0 else 0
    return [v for v in (2 * value, 3 * value, half, value + 1) if v > 1 and v != value]


_INITS = ("normal_", "uniform_", "zero_", "fill_", "random_", "bernoulli_", "exponential_")
_INIT_FUNCTIONS = (
    "normal_", "uniform_", "trunc_normal_", "constant_", "zeros_", "ones_", "eye_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
)  # fmt: skip


@contextlib.contextmanager
def _no_init():
    """Weight initialisation skipped while a twin is built on ``meta``: it fills nothing
    there, yet a meta ``normal_`` goes through ``torch._refs``, whose first use imports
    ``torch._dynamo`` (about 800 modules, most of a second) — a cost for no data."""

    def keep(tensor, *args, **kwargs):
        return tensor

    saved = [(torch.Tensor, name, getattr(torch.Tensor, name)) for name in _INITS]
    saved += [(torch.nn.init, name, getattr(torch.nn.init, name)) for name in _INIT_FUNCTIONS]
    try:
        for owner, name, _ in saved:
            setattr(owner, name, keep)
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def run_knob(
    model: torch.nn.Module,
    rebuild: Callable[[Any], torch.nn.Module],
    config: Any,
    knob: str,
    call: tuple[tuple, dict],
    train: bool,
    ops: bool,
    shapes_pass: ShapesPass,
    avoid: set[int] = frozenset(),
) -> tuple[Other | None, Any, str | None]:
    """The model rebuilt with one config knob moved and run on the same inputs: its trace,
    the config it ran with, or why it could not. A small model (:data:`SMALL_MODEL_BYTES`)
    is rebuilt and run for real, faster than on ``meta``; a larger one on ``meta``, with
    shape-only inputs and no initialisation. The user's model and random state are not
    touched. Cached per model."""
    value = read_knob(config, knob)
    if value is None:
        return None, None, f"config.{knob} is not an int"
    args, kwargs = call
    key = ("knob", knob, signature(args, kwargs, train))
    per_model = _CACHE.setdefault(model, {})
    if key in per_model:
        return per_model[key]
    why = "no value of it builds and runs"
    real = _small_enough_to_run(model)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    values = knob_values(value)
    for new in sorted(values, key=lambda v: v in avoid):  # a size no other letter has first
        started = time.perf_counter()
        try:
            with _quiet():
                twin_config = with_knob(config, knob, new)
                other, twin = _run_twin(rebuild, twin_config, real, device, call, train, ops,
                                        shapes_pass)  # fmt: skip
        except Exception as e:  # a size the model's own checks refuse: try the next
            why = _reason(e)
            continue
        if other.partial:
            why = other.partial
            continue
        other.seconds = round(time.perf_counter() - started, 6)
        other.twin = twin
        per_model[key] = (other, twin_config, None)
        return other, twin_config, None
    per_model[key] = (None, None, why)
    return None, None, why


def _run_twin(rebuild, twin_config, real, device, call, train, ops, shapes_pass):
    """Build the twin (for real, or on ``meta`` uninitialised) and trace it on ``call``."""
    args, kwargs = call
    if real:  # a small model: built and run for real (no meta ops, no RNG moved)
        with torch.random.fork_rng(devices=[]):
            twin = rebuild(twin_config).to(device).train(train)
            run = functools.partial(twin, *args, **kwargs)
            return _traced(twin, run, 0, 0, "device", train, ops, shapes_pass), twin
    with torch.device("meta"), _no_init():
        twin = rebuild(twin_config)
    twin.train(train)
    margs, mkwargs = _resize(args, 0, 0, 0, 0, meta=True), _resize(kwargs, 0, 0, 0, 0, meta=True)
    run = functools.partial(twin, *margs, **mkwargs)
    return _traced(twin, run, 0, 0, "meta", train, ops, shapes_pass), twin


@contextlib.contextmanager
def _quiet():
    """A twin's build says nothing: its config's complaints (``Can't set head_dim``) and
    warnings are about sizes the user never chose."""
    level = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(level)
