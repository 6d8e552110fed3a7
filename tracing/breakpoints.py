"""Breakpoints: conditions on steps and tensors, checked live or over a saved trace.

A *condition* looks at one step and the tensors it produced and answers with a reason
("3 Inf values in output") when it holds, or ``None`` when it does not:

- :class:`NonFinite` — a NaN or an Inf appears in an output;
- :class:`AbsAbove` — an output holds a value whose magnitude exceeds a threshold;
- :class:`AttentionEntropyBelow` — a row of an attention map is sharper than a threshold
  (entropy in nats; a row spread evenly over ``n`` keys has entropy ``ln n``);
- :class:`ModuleIs` / :class:`OpIs` — a named module is entered, a named op runs;
- :class:`GradNormAbove` / :class:`GradNormBelow` — a backward step's gradient has an
  L2 norm above / below a threshold (an exploding or a vanishing layer).

``NonFinite`` and ``AbsAbove`` look at every step's outputs, so in a training-step trace
(``tracing.trace_step``) they see the gradients too: :func:`first_nonfinite_gradient`
names the first backward step whose gradient is not finite, and the forward op and
source line it belongs to (what ``torch.autograd.detect_anomaly`` prints, but navigable).

A list of conditions means *any of them*; ``a & b`` holds when both do (``ModuleIs
("blocks.2") & NonFinite()``: a NaN inside block 2), ``a | b`` when either does.

Two ways to use them:

- **Live**: ``tracing.trace(model, x, break_on=[NonFinite()])`` stops the forward at the
  first step that meets a condition and returns the trace up to that step, with
  ``trace.meta["stopped_at"]`` saying where and why. The forward is not finished.
- **Saved**: :func:`find_next` walks a recorded trace ("run to next breakpoint"), using
  the kept values where there are some and the statistics where there are not.

Order of events
---------------
A module step is recorded when the module is *entered*, but its outputs only exist when it
*exits*, after every op inside. Conditions on names fire on entry; conditions on values
fire where the value is produced: at the op itself, or at the module's exit. So the first
Inf is found at the op that made it, not at the enclosing block that merely returned it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from tracing.formatting import step_number, step_text

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from tracing.record import Step, TensorRecord, Trace

Event = Literal["enter", "exit"]
"""``enter``: a module call begins (no outputs yet). ``exit``: outputs exist (an op that
returned, or a module call that finished)."""


# --------------------------------------------------------------------------- data seen


class Output:
    """One output of a step as a condition sees it: its record and, if known, its value.

    ``value`` may be given directly (live) or by a ``loader`` called on first use (a saved
    trace reads the tensor from disk only when a condition needs it). Conditions prefer
    the record's statistics where they suffice: computed from the full-precision tensor,
    they stay exact when a trace keeps its values downcast to float16.
    """

    __slots__ = ("_counts", "_loader", "_value", "came_in", "name", "record")

    def __init__(
        self,
        record: TensorRecord | None,
        value: torch.Tensor | None = None,
        name: str = "output",
        loader: Callable[[], torch.Tensor | None] | None = None,
        came_in: tuple[bool, bool] | None = None,
    ):
        self.record = record
        self._value = value
        self._loader = loader
        self.name = name
        self.came_in = came_in
        """(a NaN came in, an Inf came in): whether what the step computed from already
        held NaN / Inf (its inputs' for an op; for a backward step, the gradients the
        nodes that passed it its gradient had received). None: not known."""
        self._counts: tuple[int, int] | None = None

    @property
    def value(self) -> torch.Tensor | None:
        if self._value is None and self._loader is not None:
            self._value = self._loader()
            self._loader = None
        return self._value

    @property
    def stats(self):
        return None if self.record is None else self.record.stats

    @property
    def is_attention(self) -> bool:
        return self.record is not None and self.record.role == "attention"


@dataclass(frozen=True)
class BreakHit:
    """Where and why a breakpoint fired."""

    step: int  # index of the step in ``trace.steps`` (0-based; people read step_number)
    event: Event
    reason: str
    label: str = ""  # "blocks.2.ff · mul"
    source: str = ""  # "model.py:42: x = x * 1e39"

    def to_meta(self) -> dict[str, Any]:
        """JSON-ready form stored as ``trace.meta["stopped_at"]``: ``step`` is the step
        number people read (1-based, as the app counts), ``index`` its place in
        ``trace.steps`` (files written before ``index`` was stored: :func:`stopped_at`)."""
        return {
            "step": step_number(self.step),
            "index": self.step,
            "event": self.event,
            "reason": self.reason,
            "label": self.label,
            "source": self.source,
        }


class StopForward(Exception):
    """Raised from inside the traced forward to stop it at a breakpoint.

    The tracer catches it, keeps everything recorded so far and returns the trace with
    ``meta["stopped_at"]``; it never reaches the caller.
    """

    def __init__(self, hit: BreakHit):
        super().__init__(f"breakpoint at {step_text(hit.step)}: {hit.reason}")
        self.hit = hit


# --------------------------------------------------------------------------- conditions


class Condition:
    """Base class. Override :meth:`on_enter` and/or :meth:`on_exit`."""

    def on_enter(self, step: Step) -> str | None:
        """A module call begins. Return a reason to break, or None."""
        return None

    def on_exit(self, step: Step, outputs: Sequence[Output]) -> str | None:
        """A step's outputs exist. Return a reason to break, or None."""
        return None

    def check(self, step: Step, event: Event, outputs: Sequence[Output] = ()) -> str | None:
        return self.on_enter(step) if event == "enter" else self.on_exit(step, outputs)

    def __and__(self, other: Condition) -> Condition:
        return AllOf((self, other))

    def __or__(self, other: Condition) -> Condition:
        return AnyOf((self, other))


@dataclass(frozen=True)
class AnyOf(Condition):
    """Holds when any of its conditions does (a plain list of conditions means this)."""

    conditions: tuple[Condition, ...]

    def check(self, step, event, outputs=()):
        for c in self.conditions:
            reason = c.check(step, event, outputs)
            if reason:
                return reason
        return None


@dataclass(frozen=True)
class AllOf(Condition):
    """Holds when all of its conditions hold at the same event.

    Name conditions (:class:`ModuleIs`, :class:`OpIs`) also hold at ``exit`` events here,
    so ``ModuleIs("blocks.2", within=True) & NonFinite()`` means "a NaN inside block 2".
    """

    conditions: tuple[Condition, ...]

    def check(self, step, event, outputs=()):
        reasons = []
        for c in self.conditions:
            if isinstance(c, _NameCondition):
                reason = c.matches(step)
            else:
                reason = c.check(step, event, outputs)
            if not reason:
                return None
            reasons.append(reason)
        return " and ".join(reasons)


class _NameCondition(Condition):
    def matches(self, step: Step) -> str | None:  # pragma: no cover - overridden
        raise NotImplementedError


@dataclass(frozen=True)
class ModuleIs(_NameCondition):
    """Break when the module at ``path`` is entered (a module breakpoint).

    With ``within=True`` any step inside that module's subtree matches too (useful
    combined with a value condition: ``ModuleIs("blocks.2", within=True) & NonFinite()``).
    """

    path: str
    within: bool = False

    def matches(self, step: Step) -> str | None:
        m = step.module
        if m == self.path or (self.within and (self.path == "" or m.startswith(self.path + "."))):
            return f"module {self.path or '<root>'}"
        return None

    def on_enter(self, step):
        return self.matches(step) if step.kind == "module" else None

    def on_exit(self, step, outputs):
        # ops inside the module match only with within=True (entry covers the module)
        if step.kind == "op" and self.within:
            return self.matches(step)
        return None


@dataclass(frozen=True)
class OpIs(_NameCondition):
    """Break when an op named ``name`` runs (``"softmax"``, ``"matmul"``...).

    Also matches a module step whose type is ``name`` (``OpIs("Linear")``), on entry.
    ``module`` optionally restricts it to one module path.
    """

    name: str
    module: str | None = None

    def matches(self, step: Step) -> str | None:
        if step.op != self.name:
            return None
        if self.module is not None and step.module != self.module:
            return None
        return f"op {self.name}"

    def on_enter(self, step):
        return self.matches(step) if step.kind == "module" else None

    def on_exit(self, step, outputs):
        return self.matches(step) if step.kind == "op" else None


MASK_OPS = frozenset({"masked_fill", "masked_fill_", "where"})
"""Ops whose ``-inf`` outputs are a causal mask at work (``masked_fill(~mask, -inf)``
before the softmax), not a numerical problem: value conditions ignore an Inf they make."""


@dataclass(frozen=True)
class NonFinite(Condition):
    """Break where a NaN or an Inf is *made*: the one definition of "where it went
    non-finite" that live breaks, the app's N, :func:`first_nonfinite_gradient` and the
    report share.

    A step is where it went non-finite when its own computation turned what it was given
    into a non-finite output: a NaN where no input held a NaN, or an Inf where no input
    held a NaN or an Inf. So the op that overflowed stops the run, not the ops (and the
    module calls) that merely pass its Inf along. Innermost: a module call counts only
    for outputs no op inside it produced. In the backward the step is the node that
    *produced* the gradient: a backward step records the gradient it receives, so when
    that gradient is the first non-finite one, the hit names the node that sent it
    (:func:`find_hit` moves it there).

    The Inf a mask op writes (see ``MASK_OPS``) does not count, a NaN anywhere does;
    without that every causal attention layer would stop the run at its mask. Where it
    is not known what a step was given (``Output.came_in`` is None), any NaN or Inf in
    an output holds.
    """

    mask_ops: frozenset[str] = MASK_OPS

    def on_exit(self, step, outputs):
        at_mask = step.op in self.mask_ops
        for o in outputs:
            if not _made_here(step, o):
                continue
            nan, inf = _nonfinite_counts(o)
            if at_mask:
                inf = 0
            if o.came_in is not None:
                nan_in, inf_in = o.came_in
                if nan_in:
                    nan = 0
                if nan_in or inf_in:
                    inf = 0
            if nan or inf:
                parts = [f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "Inf")) if n]
                why = " (made from an Inf it was given)" if o.came_in and o.came_in[1] else ""
                return f"{' and '.join(parts)} in {o.name}{why}"
        return None


def _made_here(step: Step, o: Output) -> bool:
    """Whether ``step`` itself produced output ``o`` (a module's output that an op inside
    it produced is that op's, so the op is where it went non-finite, not the module)."""
    if step.kind != "module" or o.record is None or o.record.producer is None:
        return True
    return o.record.producer == step.index


def uses_nonfinite(condition: Condition) -> bool:
    """Whether ``condition`` is or contains :class:`NonFinite` (then the steps' inputs
    are worth following, to tell where a NaN was made from where it was passed on)."""
    if isinstance(condition, NonFinite):
        return True
    return any(uses_nonfinite(c) for c in getattr(condition, "conditions", ()))


@dataclass(frozen=True)
class AbsAbove(Condition):
    """Break when an output holds a value with ``|x| > threshold`` (Inf counts, except the
    ``-inf`` of a mask op: there only the finite values are compared)."""

    threshold: float
    mask_ops: frozenset[str] = MASK_OPS

    def on_exit(self, step, outputs):
        finite_only = step.op in self.mask_ops
        for o in outputs:
            m = _abs_max(o, finite_only=finite_only)
            if m is not None and m > self.threshold:
                return f"|x| = {m:.4g} > {self.threshold:g} in {o.name}"
        return None


@dataclass(frozen=True)
class AttentionEntropyBelow(Condition):
    """Break when a row of an attention map has entropy below ``threshold`` (nats).

    Applies to outputs whose record has role ``"attention"`` (shaped ``(..., T, T)``). The
    first ``skip_rows`` query positions are ignored: under a causal mask the first query
    sees one key only, so its entropy is always 0.
    """

    threshold: float
    skip_rows: int = 1

    def on_exit(self, step, outputs):
        for o in outputs:
            if not o.is_attention or o.value is None or o.value.dim() < 2:
                continue
            ent = attention_entropy(o.value)  # (..., T)
            ent = ent[..., self.skip_rows :]
            if ent.numel() == 0:
                continue
            low = float(ent.nan_to_num(nan=math.inf).min())
            if low < self.threshold:
                return f"attention row entropy {low:.4g} < {self.threshold:g}"
        return None


def grad_norm(o: Output) -> float | None:
    """L2 norm of an output, from its statistics when kept, else from its value (NaN if it
    holds a NaN, Inf if an Inf); None when neither is known."""
    s = o.stats
    if s is not None and o.record is not None:
        if s.nan:
            return math.nan
        if s.inf:
            return math.inf
        n_finite = o.record.numel - s.nan - s.inf
        return math.sqrt(max(n_finite * (s.std * s.std + s.mean * s.mean), 0.0))
    value = o.value
    if value is None or not value.is_floating_point():
        return None
    return float(value.detach().double().norm())


def _grad_norm_reason(step, outputs, threshold: float, above: bool) -> str | None:
    """The reason a backward step's gradient norm is above (or below) ``threshold``.
    Gradients inside one op (of no recorded tensor) are not judged when looking below."""
    if step.kind != "backward":
        return None
    for o in outputs:
        rec = o.record
        if not above and rec is not None and rec.grad_of is None:
            continue
        n = grad_norm(o)
        if n is None:
            continue
        if (n > threshold or math.isnan(n)) if above else n < threshold:
            sign = ">" if above else "<"
            return f"gradient norm {n:.4g} {sign} {threshold:g} in {o.name}"
    return None


@dataclass(frozen=True)
class GradNormAbove(Condition):
    """Break at a backward step whose gradient has an L2 norm above ``threshold``
    (an exploding layer; a NaN norm counts). Only gradients count, not forward values."""

    threshold: float
    gradient_only = True

    def on_exit(self, step, outputs):
        return _grad_norm_reason(step, outputs, self.threshold, above=True)


@dataclass(frozen=True)
class GradNormBelow(Condition):
    """Break at a backward step of a recorded tensor or a parameter whose gradient has an
    L2 norm below ``threshold`` (a vanishing layer)."""

    threshold: float
    gradient_only = True

    def on_exit(self, step, outputs):
        return _grad_norm_reason(step, outputs, self.threshold, above=False)


def first_nonfinite_gradient(trace: Trace) -> BreakHit | None:
    """Where a training step's gradients went non-finite, or None when they did not.

    The backward step whose node first *produced* a NaN or an Inf gradient: a backward
    step records the gradient it receives, so the first one to receive a non-finite
    gradient got it from a node that ran before it (``SqrtBackward0`` for a ``sqrt`` at 0,
    which sends Inf to the op before it); that node is the hit, with the label and source
    line of its forward op (``blocks.1.attn · sqrt``, ``model.py:42: ...``).

    When the forward was already non-finite, the gradients only follow from it: the hit
    is then the forward op where it went non-finite (:class:`NonFinite`), and its reason
    says which backward step it reached.
    """
    start = trace.backward_start
    if start is None:
        return None
    backward = next(iter_origins(trace, start - 0.5), None)
    forward = next(iter_origins(trace, -1.0, stop=start), None)
    if forward is None:
        return backward
    then = "; the backward never went non-finite"
    if backward is not None:
        then = (
            f"; the forward was already non-finite here, so the backward's first "
            f"non-finite gradient ({step_text(backward.step)}, {trace.steps[backward.step].op}) "
            "follows from it"
        )
    return BreakHit(forward.step, forward.event, forward.reason + then, forward.label,
                    forward.source)  # fmt: skip


def nonfinite_origin(trace: Trace, after: int = -1) -> BreakHit | None:
    """The next step after step ``after`` where it went non-finite (:class:`NonFinite`):
    what the app's N goes to. A backward hit names the node that produced the gradient,
    which ran before the step that received it, so the search is by the hit's step."""
    for hit in iter_origins(trace, -1.0):
        if hit.step > after:
            return hit
    return None


def iter_origins(trace: Trace, start: float = -1.0, stop: int | None = None):
    """Every :class:`NonFinite` hit after position ``start`` (and before step ``stop``)."""
    cond = NonFinite()
    for pos, index, event in _events(trace):
        if pos <= start or event == "enter":
            continue
        if stop is not None and index >= stop:
            break
        step = trace.steps[index]
        outputs = step_outputs(trace, step)
        reason = cond.check(step, event, outputs)
        if reason:
            yield _hit_at_origin(trace, step, event, reason, outputs)


def grad_senders(trace: Trace, step: Step) -> list[int] | None:
    """The backward steps that passed ``step`` its gradient (the nodes whose outputs it
    consumed, the ones that ran), as recorded by ``tracing.trace_step``; None for a
    trace recorded without them."""
    senders = trace.meta.get("grad_senders")
    if not isinstance(senders, Mapping):
        return None
    got = senders.get(str(step.index))
    return None if got is None else [int(i) for i in got]


def _hit_at_origin(trace: Trace, step: Step, event: Event, reason: str,
                   outputs: Sequence[Output]) -> BreakHit:  # fmt: skip
    """The hit for ``reason`` at ``step``; at a backward step that received a gradient made
    non-finite by the node that sent it, the hit is at that node (see :class:`NonFinite`)."""
    if step.kind != "backward" or not any(sum(_nonfinite_counts(o)) for o in outputs):
        return make_hit(step, event, reason)
    came_in = outputs[0].came_in if outputs else None
    if came_in is not None and any(came_in):
        return make_hit(step, event, reason)
    senders = grad_senders(trace, step)
    if senders is None:  # an older trace: the forward graph says who
        sender = _sender(trace, step)
        senders = [] if sender is None else [sender.index]
    senders = sorted(i for i in senders if 0 <= i < step.index)
    if not senders:
        return make_hit(step, event, reason)
    return sender_hit(trace.steps, step, reason, senders)


def sender_hit(steps: Sequence[Step], receiver: Step, reason: str,
               senders: Sequence[int]) -> BreakHit:  # fmt: skip
    """The hit at the node that sent ``receiver`` its non-finite gradient (the latest of
    ``senders`` to run; when several passed it one, the reason names them all, since
    which of them sent the NaN is not recorded)."""
    sender = steps[senders[-1]]
    got = steps[receiver.forward].op if receiver.forward is not None else receiver.op
    reason = reason.removesuffix(" in grad").split(" in grad", 1)[0]
    reason = f"{reason} in the gradient it sends back to {got} ({step_text(receiver.index)})"
    if len(senders) > 1:
        names = ", ".join(f"{steps[i].op} ({step_text(i)})" for i in senders)
        reason += (
            f"; {len(senders)} nodes pass it gradients ({names}): which one sent it is not recorded"
        )
    if sender.forward is None:
        return make_hit(sender, "exit", f"{reason} ({sender.op})")
    fwd = steps[sender.forward]
    src = make_hit(fwd, "exit", "").source
    reason = f"{reason} ({sender.op}, the backward of {step_text(fwd.index)}: {fwd.op})"
    return BreakHit(sender.index, "exit", reason, fwd.label, src)


def _sender(trace: Trace, receiver: Step) -> Step | None:
    """The latest backward step before ``receiver`` whose forward op consumed a tensor
    ``receiver`` holds the gradient of (the op that passed it that gradient): for traces
    recorded before ``meta["grad_senders"]``."""
    start = trace.backward_start
    forward_ids = {trace.tensors[t].grad_of for t in receiver.outputs} - {None}
    if not forward_ids or start is None:
        return None
    consumers = {
        s.index
        for s in trace.steps[:start]
        if s.kind == "op" and not forward_ids.isdisjoint(s.inputs)
    }
    for s in reversed(trace.steps[start : receiver.index]):
        if s.forward in consumers:
            return s
    return None


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of every row of an attention map: ``(..., Tq, Tk) -> (..., Tq)``.

    ``0 log 0`` counts as 0, so masked (zero) keys do not contribute.
    """
    import torch

    p = weights.detach().to(torch.float64)
    logp = torch.where(p > 0, p.log(), torch.zeros_like(p))
    return -(p * logp).sum(-1)


def _as_float(value: torch.Tensor) -> torch.Tensor | None:
    if not (value.is_floating_point() or value.is_complex()):
        return None
    return value.detach()


def nonfinite_counts(o: Output) -> tuple[int, int]:
    """(NaN count, Inf count) of an output, from its statistics or its value."""
    if o._counts is None:
        o._counts = _count_nonfinite(o)
    return o._counts


_nonfinite_counts = nonfinite_counts


def _count_nonfinite(o: Output) -> tuple[int, int]:
    if o.stats is not None:
        return o.stats.nan, o.stats.inf
    value = o.value
    if value is None:
        return 0, 0
    import torch  # a kept value is a tensor: torch is imported already

    v = _as_float(value)
    if v is None or v.numel() == 0:
        return 0, 0
    return int(torch.isnan(v).sum()), int(torch.isinf(v).sum())


def _abs_max(o: Output, finite_only: bool = False) -> float | None:
    """Largest ``|x|`` of an output (``inf`` if it holds an Inf, unless ``finite_only``)."""
    import torch

    s = o.stats
    if s is not None:  # min / max are over the finite elements
        if s.inf and not finite_only:
            return math.inf
        vals = [abs(x) for x in (s.min, s.max) if math.isfinite(x)]
        return max(vals) if vals else None
    value = o.value
    if value is None:
        return None
    v = _as_float(value)
    if v is None or v.numel() == 0:
        return None
    v = v.abs()
    if not finite_only and bool(torch.isinf(v).any()):
        return math.inf
    finite = v[torch.isfinite(v)]
    return float(finite.max()) if finite.numel() else None


def as_condition(conditions: Condition | Iterable[Condition]) -> Condition:
    """A single condition from one condition or a list (any of them)."""
    if isinstance(conditions, Condition):
        return conditions
    conds = tuple(conditions)
    for c in conds:
        if not isinstance(c, Condition):
            raise TypeError(
                f"break_on expects tracing.breakpoints conditions (NonFinite(), AbsAbove(1e4),"
                f" ModuleIs('blocks.2')...), got {type(c).__name__}: {c!r}"
            )
    return conds[0] if len(conds) == 1 else AnyOf(conds)


# --------------------------------------------------------------------------- saved traces


def step_outputs(trace: Trace, step: Step) -> list[Output]:
    """The outputs of ``step`` as conditions see them (named, values read on demand, and
    what the step was given: see ``Output.came_in``)."""
    names = step.output_names if len(step.output_names) == len(step.outputs) else ()
    came_in = _came_in(trace, step) if step.outputs else None
    outs = []
    for k, tid in enumerate(step.outputs):
        rec = trace.tensors[tid]
        name = names[k] if names else f"output[{k}]"
        loader = functools.partial(trace.value, rec.id)
        outs.append(Output(rec, name=name, loader=loader, came_in=came_in))
    return outs


def _came_in(trace: Trace, step: Step) -> tuple[bool, bool] | None:
    """Whether a NaN / an Inf was among what ``step`` computed from: a forward step's
    inputs that earlier steps produced (a parameter or the model's input is where a
    computation starts, so a NaN weight is found at the op that uses it); for a backward
    step, the gradients received by the nodes that passed it its gradient. From the
    statistics, or the kept values; None when the trace does not say (a backward step of
    a trace recorded without ``meta["grad_senders"]``)."""
    if step.kind == "backward":
        senders = grad_senders(trace, step)
        if senders is None:
            return None
        ids = [rid for i in senders if 0 <= i < len(trace.steps) for rid in trace.steps[i].outputs]
    else:
        ids = [rid for rid in step.inputs if trace.tensors[rid].producer is not None]
    nan = inf = False
    for rid in ids:
        loader = functools.partial(trace.value, rid)
        n, i = _nonfinite_counts(Output(trace.tensors[rid], loader=loader))
        nan, inf = nan or n > 0, inf or i > 0
    return nan, inf


def _events(trace: Trace) -> list[tuple[float, int, Event]]:
    """Every (position, step index, event) in execution order."""
    events: list[tuple[float, int, Event]] = []
    for s in trace.steps:
        if s.kind == "module":
            events.append((float(s.index), s.index, "enter"))
            end = s.end
            if end is None:
                end = max((t.index for t in trace.steps if t.parent == s.index), default=s.index)
            events.append((end + 0.5, s.index, "exit"))
        else:
            events.append((float(s.index), s.index, "exit"))
    events.sort()
    return events


def find_hit(
    trace: Trace, start: float, conditions: Condition | Iterable[Condition]
) -> BreakHit | None:
    """The first breakpoint hit strictly after position ``start`` (see :func:`find_next`).

    Positions: a step's entry is its index, a module call's exit is ``end + 0.5``. Use
    ``start=-1`` to search from the beginning.
    """
    cond = as_condition(conditions)
    for pos, index, event in _events(trace):
        if pos <= start:
            continue
        step = trace.steps[index]
        outputs = step_outputs(trace, step) if event == "exit" else ()
        reason = cond.check(step, event, outputs)
        if reason:
            hit = _hit_at_origin(trace, step, event, reason, outputs)
            if hit.step == index or hit.step > start:  # a sender already passed: go on
                return hit
    return None


def find_next(trace: Trace, start: int, conditions: Condition | Iterable[Condition]) -> int | None:
    """Index of the next step after step ``start`` where a condition holds ("run to next
    breakpoint"), or None. ``start=-1`` searches from the first step.

    Value conditions use the kept values where the trace has them and the statistics
    otherwise (``NonFinite``, ``AbsAbove``); ``AttentionEntropyBelow`` needs the attention
    maps, which every capture level keeps.
    """
    hit = find_hit(trace, float(start), conditions)
    return None if hit is None else hit.step


def find_all(trace: Trace, conditions: Condition | Iterable[Condition]) -> list[BreakHit]:
    """Every hit in the trace, in execution order (for a breakpoint list in the app)."""
    cond = as_condition(conditions)
    hits = []
    for _pos, index, event in _events(trace):
        step = trace.steps[index]
        outputs = step_outputs(trace, step) if event == "exit" else ()
        reason = cond.check(step, event, outputs)
        if reason:
            hits.append(_hit_at_origin(trace, step, event, reason, outputs))
    return hits


def make_hit(step: Step, event: Event, reason: str) -> BreakHit:
    src = ""
    if step.source is not None:
        src = f"{step.source.file}:{step.source.line}: {step.source.text}"
    return BreakHit(step.index, event, reason, step.label, src)


# --------------------------------------------------------------------------- live


class LiveBreaker:
    """What the tracer calls during a forward to stop at the first breakpoint.

    The tracer calls :meth:`enter` when it records a module step and :meth:`exit` when a
    step's outputs exist, passing the live tensors. When a condition holds, these raise
    :class:`StopForward`, which the tracer catches.
    """

    Stop = StopForward  # what the tracer catches

    def __init__(self, conditions: Condition | Iterable[Condition]):
        self.condition = as_condition(conditions)
        # record id -> (NaN, Inf) of the non-finite outputs seen so far, when a NaN's
        # origin matters (NonFinite): a step given one of them did not make it
        self.nonfinite: dict[int, tuple[bool, bool]] | None = (
            {} if uses_nonfinite(self.condition) else None
        )

    def enter(self, step: Step) -> None:
        reason = self.condition.check(step, "enter", ())
        if reason:
            raise StopForward(make_hit(step, "enter", reason))

    def exit(
        self,
        step: Step,
        records: Sequence[TensorRecord | None],
        tensors: Sequence[torch.Tensor | None],
    ) -> None:
        names = step.output_names if len(step.output_names) == len(tensors) else ()
        seen = self.nonfinite
        came_in = None
        if seen is not None:
            got = [seen[rid] for rid in step.inputs if rid in seen]
            came_in = (any(n for n, _ in got), any(i for _, i in got))
        outputs = [
            Output(rec, t, names[k] if names else f"output[{k}]", came_in=came_in)
            for k, (rec, t) in enumerate(zip(records, tensors))
        ]
        reason = self.condition.check(step, "exit", outputs)
        if reason:
            raise StopForward(make_hit(step, "exit", reason))
        if seen is not None:
            for o in outputs:
                nan, inf = _nonfinite_counts(o)
                if (nan or inf) and o.record is not None:
                    seen[o.record.id] = (nan > 0, inf > 0)
