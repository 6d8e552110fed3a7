"""Edits: change a value while the model runs, then let the forward pass go on.

A debugger lets you set a variable and continue; for a transformer that means zeroing a
head, halving a residual branch, or putting the clean run's activation into a corrupted
run. An :class:`Edit` names a :mod:`site <tracing.sites>` and an action:

>>> from tracing.edits import Edit, Zero, Scale, Patch
>>> t = tracing.trace(model, tokens, edits=[                              # doctest: +SKIP
...     Edit("blocks.1.self_attn.attention", Zero(), head=2),            # one head
...     Edit("blocks.0.feed_forward", Scale(0.5), positions=[3, 4]),     # two positions
...     Edit("blocks.1.self_attn.attention:softmax#0", Patch(clean)),   # from another trace
... ])
>>> t.meta["edits"][0]["steps"]                                           # doctest: +SKIP

``("site", action)`` pairs work too. Actions: :class:`Zero`, :class:`Scale`, :class:`Add`,
:class:`Set`, :class:`MeanAblate`, :class:`Patch`, or any function ``value -> value``.

How an edit is applied: the instrument that already sees the value replaces it (the tracer's
op mode for an op site, its module wrapper for a module's output; :func:`run_edited` uses
hooks on the addressed modules only). The model's code and weights are never touched, so
the model is unchanged afterwards. Only the addressed calls are edited: ``"blocks.0@1"`` is
the second call of ``blocks.0``, ``"blocks.0"`` every call. ``head=`` selects along the
heads axis (axis 1 of a ``(B, H, T, ...)`` tensor, or ``head_axis=``), ``positions=`` along
the time axis (``position_axis=``, by default the one before last: ``T`` of ``(B, T, C)``,
of ``(B, H, T, D)``, the query axis of ``(B, H, T, T)``); the rest of the value is kept
bit for bit. A site that matches nothing is an error, never a silent no-op.

``head=`` on an ``nn.MultiheadAttention``'s path edits each head's output ``(B, H, T, D)``
just before its ``out_proj`` (:mod:`tracing.capture.heads`); ``head=`` on any other module
whose output has no heads axis (a Hugging Face ``LlamaAttention``, our
``MultiHeadAttention``) edits the one per-head output the trace recorded inside it
(:meth:`EditPlan.resolve_heads`), or is an error naming the sites there when it has none or
several; ``head=`` on a softmax (the attention *weights*) needs ``on="weights"``, so that
it is never meant by accident.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from tracing.sites import Site, parse_site, site_steps

if TYPE_CHECKING:  # pragma: no cover
    from tracing.record import Trace


class EditError(ValueError):
    """An edit cannot be applied: an unknown or unmatched site, a shape that does not fit,
    a patch source without a value there."""


# --------------------------------------------------------------------------- actions


class Action:
    """What an edit does to the value at its site: ``apply(value, ctx) -> new value``.

    ``value`` is the whole tensor at the site; the edit keeps only the selected heads and
    positions of the result, so an action need not know about them.
    """

    def apply(self, value: torch.Tensor, ctx: EditContext) -> torch.Tensor:
        raise NotImplementedError  # pragma: no cover

    def describe(self) -> str:
        return f"{type(self).__name__}()"


@dataclass(frozen=True)
class EditContext:
    """Where an action runs: the edit, and the site with the call number filled in."""

    edit: Edit
    site: Site  # with ``call`` set to the call being edited
    within: str | None = None  # the per-head output inside this op's call (heads of an MHA)


class Zero(Action):
    """Replace the value with zeros (zero ablation)."""

    def apply(self, value, ctx):
        return torch.zeros_like(value)


@dataclass(frozen=True)
class Scale(Action):
    """Multiply the value by ``k`` (``Scale(0.5)`` halves a residual branch; ``Scale(1.0)``
    changes nothing, bit for bit)."""

    k: float

    def apply(self, value, ctx):
        return value * self.k

    def describe(self) -> str:
        return f"Scale({self.k!r})"


def _broadcast(tensor: torch.Tensor, value: torch.Tensor, what: str, ctx: EditContext):
    t = torch.as_tensor(tensor).to(device=value.device, dtype=value.dtype)
    try:
        return t.expand_as(value)
    except RuntimeError:
        raise EditError(
            f"{what} at {ctx.site}: a tensor of shape {tuple(t.shape)} does not broadcast "
            f"to the value there, shape {tuple(value.shape)}"
        ) from None


@dataclass(frozen=True, eq=False)
class Add(Action):
    """Add a tensor (broadcast against the value: a direction in the residual stream)."""

    tensor: Any

    def apply(self, value, ctx):
        return value + _broadcast(self.tensor, value, "Add", ctx)

    def describe(self) -> str:
        return f"Add(tensor {tuple(torch.as_tensor(self.tensor).shape)})"


@dataclass(frozen=True, eq=False)
class Set(Action):
    """Replace the value with a tensor (broadcast against the value)."""

    tensor: Any

    def apply(self, value, ctx):
        return _broadcast(self.tensor, value, "Set", ctx).clone()

    def describe(self) -> str:
        return f"Set(tensor {tuple(torch.as_tensor(self.tensor).shape)})"


@dataclass(frozen=True, eq=False)
class MeanAblate(Action):
    """Replace the value with a mean, which keeps its typical size (unlike zeros).

    ``over``: ``"positions"`` (the mean over the time axis of this run, the default),
    ``"batch"`` (over this run's batch), or a reference: a ``values`` :class:`Trace` of the
    same model on other inputs, or a tensor of such values, whose mean over its batch
    axis is used (the mean over a data set, as TransformerLens users compute it).
    """

    over: Any = "positions"
    _found: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def apply(self, value, ctx):
        over = self.over
        if isinstance(over, str):
            if over == "positions":
                axis = ctx.edit.position_axis
                return value.mean(dim=axis, keepdim=True).expand_as(value).clone()
            if over == "batch":
                return value.mean(dim=0, keepdim=True).expand_as(value).clone()
            raise EditError(
                f"MeanAblate(over={over!r}): over is 'positions', 'batch', "
                "a values trace or a tensor"
            )
        reference = (
            over
            if isinstance(over, torch.Tensor)
            else _value_at(over, ctx, "MeanAblate", self._found)
        )
        if reference.shape[1:] != value.shape[1:]:
            raise EditError(
                f"MeanAblate at {ctx.site}: the reference has shape {tuple(reference.shape)}, "
                f"the value has shape {tuple(value.shape)} (they may differ in batch only)"
            )
        mean = reference.to(device=value.device, dtype=value.dtype).mean(dim=0, keepdim=True)
        return mean.expand_as(value).clone()

    def describe(self) -> str:
        over = self.over if isinstance(self.over, str) else type(self.over).__name__
        return f"MeanAblate(over={over})"


@dataclass(frozen=True, eq=False)
class Patch(Action):
    """The value at the same site in another run: a ``values`` :class:`Trace` (the same
    call of the same module), or a mapping from site strings to tensors.

    Patching the clean run's value into a corrupted run is activation patching; a shape
    mismatch (another prompt length) is a clear error.
    """

    source: Any
    _found: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def apply(self, value, ctx):
        patch = _value_at(self.source, ctx, "Patch", self._found)
        if tuple(patch.shape) != tuple(value.shape):
            raise EditError(
                f"Patch at {ctx.site}: the source value has shape {tuple(patch.shape)}, "
                f"this run's has shape {tuple(value.shape)}"
            )
        if patch.device != value.device or patch.dtype != value.dtype:
            patch = patch.to(device=value.device, dtype=value.dtype)
        return patch

    def describe(self) -> str:
        return f"Patch(from {_source_name(self.source)})"


@dataclass(frozen=True, eq=False)
class Apply(Action):
    """A user function ``value -> new value`` (same shape), e.g. ``lambda v: v.flip(-2)``."""

    fn: Callable[[torch.Tensor], torch.Tensor]
    name: str = ""

    def apply(self, value, ctx):
        out = self.fn(value)
        if not isinstance(out, torch.Tensor):
            raise EditError(
                f"the function edit at {ctx.site} returned {type(out).__name__}, not a tensor"
            )
        if out.shape != value.shape:
            raise EditError(
                f"the function edit at {ctx.site} returned shape {tuple(out.shape)}; "
                f"the value there has shape {tuple(value.shape)}"
            )
        return out

    def describe(self) -> str:
        name = self.name or getattr(self.fn, "__name__", "function")
        return f"Apply({name})"


def _source_name(source: Any) -> str:
    if isinstance(source, Mapping) and not hasattr(source, "steps"):
        return "values"
    meta = getattr(source, "meta", None) or {}
    text = meta.get("text")
    return f"trace {text!r}" if text else "trace"


def _value_at(source: Any, ctx: EditContext, what: str, found: dict) -> torch.Tensor:
    """The value at ``ctx.site`` (same call, same output) in a trace or a site mapping;
    ``found`` keeps each one looked up in a trace (a sweep or a loop asks again and again)."""
    site = ctx.site
    key = (str(site), ctx.edit.output, ctx.within)
    if key in found:
        return found[key]
    if isinstance(source, Mapping) and not hasattr(source, "steps"):
        for key in (str(site), str(Site(site.module, site.op, site.occurrence))):
            if key in source:
                return source[key]
        raise EditError(f"{what}: the source values have no entry for site {site}")
    if ctx.within is not None:  # the heads inside an nn.MultiheadAttention's call
        return _heads_at(source, ctx, what, found, key)
    steps = site_steps(source, site)
    if not steps:
        raise EditError(f"{what}: the source trace has no step at site {site}")
    step = steps[0]
    k = _output_position(step.output_names, ctx.edit.output, site)
    value = source.value(step.outputs[k]) if k < len(step.outputs) else None
    if value is None:
        capture = source.meta.get("capture", "?")
        raise EditError(
            f"{what}: the source trace kept no value at {site} (captured at {capture!r}; "
            "trace it with capture='values', and a value_cap large enough)"
        )
    found[key] = value
    return value


def _heads_at(source: Any, ctx: EditContext, what: str, found: dict, key: tuple) -> torch.Tensor:
    """The per-head output ``(B, H, T, D)`` that the source trace recorded for the same call
    of the ``ctx.within`` op (``nn.MultiheadAttention``'s) in the edited module."""
    site = ctx.site
    steps = site_steps(source, Site(site.module, ctx.within, 0, site.call))
    if not steps:
        raise EditError(f"{what}: the source trace has no {ctx.within} call in {site}")
    step = steps[0]
    if "head_outputs" not in step.output_names:
        raise EditError(
            f"{what} of a head at {site}: the source trace holds no per-head output of "
            f"that nn.MultiheadAttention (a trace made before they were recorded); trace "
            "the source run again with capture='values', or patch from a sweep"
        )
    value = source.value(step.outputs[step.output_names.index("head_outputs")])
    if value is None:
        capture = source.meta.get("capture", "?")
        raise EditError(
            f"{what} of a head at {site}: the source trace kept no value of its per-head "
            f"output (captured at {capture!r}; trace it with capture='values', and a "
            "value_cap large enough)"
        )
    found[key] = value
    return value


# --------------------------------------------------------------------------- the edit


@dataclass(frozen=True, eq=False)
class Edit:
    """One edit: ``action`` applied to the value at ``site``, optionally only to some heads
    and positions of it.

    ``output`` picks the value of a step with several outputs: an index (``1`` for the
    weights an attention module returns beside its output) or a mapping key.
    """

    site: Site | str
    action: Action | Callable[[torch.Tensor], torch.Tensor]
    head: int | Sequence[int] | None = None
    positions: int | slice | Sequence[int] | None = None
    output: int | str = 0
    head_axis: int | None = None
    position_axis: int = -2
    on: str | None = None
    via: str | None = None  # the attention module addressed, when the site was found in it
    note: str = ""  # what else the resolution showed (a GQA head's key/value head)
    heads_folded: int | None = None  # H, when the heads are folded into axis 0 as B·H

    def __post_init__(self):
        object.__setattr__(self, "site", parse_site(self.site))
        if self.on not in (None, "weights"):
            raise EditError(f"on= is 'weights' (or left out), got {self.on!r}")
        if self.head is not None and self.site.op in _WEIGHT_OPS and self.on is None:
            site = self.site
            raise EditError(
                f"head= at {site} would edit head {_index_text(self.head)}'s attention "
                "*weights* (the map the softmax makes), so every value that head mixes is "
                "mixed differently, not its output. To edit the head's output, address "
                f"the attention: Edit({site.module!r}, ..., head=h) (the module that ran "
                "the softmax, or the one that returns the per-head output); to edit the "
                f"weights, say so: Edit({str(site)!r}, ..., head=h, on='weights')"
            )
        action = self.action
        if isinstance(action, type) and issubclass(action, Action):
            action = action()  # Zero rather than Zero()
        elif not isinstance(action, Action):
            if not callable(action):
                raise TypeError(f"an edit's action is an Action or a function, got {action!r}")
            action = Apply(action)
        object.__setattr__(self, "action", action)

    def describe(self) -> str:
        """``Zero() at blocks.1.self_attn.attention head 2``; for an edit addressed to an
        attention module, ``Zero() at model.layers.1.self_attn head 2 (its per-head output
        model.layers.1.self_attn:matmul#1; ...)``."""
        text = f"{self.action.describe()} at {self.via or self.site}"
        if self.output not in (0, "output") and self.via is None:
            text += f" output {self.output}"
        if self.head is not None:
            text += f" head {_index_text(self.head)}"
        if self.on is not None:
            text += f" ({self.on})"
        if self.positions is not None:
            text += f" positions {_index_text(self.positions)}"
        inside = []
        if self.via is not None:
            output = f" output {self.output}" if self.output not in (0, "output") else ""
            inside.append(f"its per-head output {self.site}{output}")
        if self.note:
            inside.append(self.note)
        if inside:
            text += f" ({'; '.join(inside)})"
        return text

    def to_meta(self) -> dict[str, Any]:
        meta = {
            "site": str(self.site),
            "action": self.action.describe(),
            "head": _index_meta(self.head),
            "positions": _index_meta(self.positions),
            "output": self.output,
            "on": self.on,
            "via": self.via,
            "describe": self.describe(),
        }
        if self.heads_folded:
            meta["heads_folded"] = self.heads_folded
        return meta

    # ---- applying

    def edited(self, value: torch.Tensor, site: Site, within: str | None = None) -> torch.Tensor:
        """The new value for ``value`` (a tensor at this edit's site, in call ``site.call``;
        ``within``: the op whose per-head output it is, inside that op's call)."""
        ctx = EditContext(self, site, within)
        new = self.action.apply(value, ctx)
        if new.dtype != value.dtype or new.device != value.device:
            new = new.to(device=value.device, dtype=value.dtype)
        if self.head is None and self.positions is None:
            return new
        return torch.where(self._mask(value, site), new, value)

    def _mask(self, value: torch.Tensor, site: Site) -> torch.Tensor:
        """True where the selected heads and positions are, broadcastable to ``value``."""
        n = value.dim()
        mask = torch.ones([1] * n, dtype=torch.bool, device=value.device)
        if self.head is not None and self.heads_folded:
            mask = mask & _folded_mask(value, self.heads_folded, self.head, site)
        elif self.head is not None:
            axis = self.head_axis
            if axis is None:
                if n < 4:
                    error = EditError(
                        f"head= at {site} needs a value with a heads axis, (B, H, T, ...); it "
                        f"has shape {tuple(value.shape)} (edit a site after the heads are "
                        "split, or give head_axis=)"
                    )
                    error.head_module = site.module  # where to look for the heads (a hint)
                    raise error
                axis = 1
            mask = mask & _axis_mask(value, axis, self.head, "head", site)
        if self.positions is not None:
            mask = mask & _axis_mask(value, self.position_axis, self.positions, "positions", site)
        return mask


def _folded_mask(value: torch.Tensor, heads: int, index: Any, site: Site) -> torch.Tensor:
    """Rows of a ``(B·H, T, ...)`` value (the heads folded into the batch, batch outer, as
    ``bmm`` attention makes them: BART, MVP, Bloom) that belong to the selected heads:
    row ``b·H + h`` is head ``h`` of batch item ``b``."""
    rows = value.shape[0] if value.dim() else 0
    if rows % heads:
        raise EditError(
            f"head= at {site}: axis 0 of shape {tuple(value.shape)} is not the batch times "
            f"{heads} heads"
        )
    picks = _axis_mask(torch.empty(heads), 0, index, "head", site).view(heads)
    return picks.repeat(rows // heads).view([rows] + [1] * (value.dim() - 1))


def _axis_mask(value: torch.Tensor, axis: int, index: Any, what: str, site: Site):
    n = value.dim()
    if not -n <= axis < n:
        raise EditError(f"{what}: axis {axis} does not exist in shape {tuple(value.shape)}")
    size = value.shape[axis]
    picks = torch.zeros(size, dtype=torch.bool, device=value.device)
    items = [index] if isinstance(index, (int, slice)) else list(index)
    for item in items:
        if isinstance(item, int) and not -size <= item < size:
            raise EditError(
                f"{what}={item} at {site} is out of range: that axis has {size} entries "
                f"(shape {tuple(value.shape)})"
            )
        picks[item] = True
    shape = [1] * n
    shape[axis] = size
    return picks.view(shape)


_WEIGHT_OPS = frozenset({"softmax", "_softmax"})  # their output is attention weights


def _module_head_edit(e: Edit) -> bool:
    """``head=`` on a module's output, the heads axis left to the edit to find."""
    return (
        e.site.op is None
        and e.head is not None
        and e.head_axis is None
        and e.output in (0, "output")
    )


def _mha_head_edit(e: Edit, module: nn.Module | None) -> bool:
    """``head=`` on an ``nn.MultiheadAttention``: its per-head output, inside its call."""
    return _module_head_edit(e) and isinstance(module, nn.MultiheadAttention)


def _lacks_heads_axis(trace: Trace, e: Edit) -> bool:
    """Whether ``e``'s module, in the first call of it that ``trace`` holds, returned an
    output with no heads axis (fewer than 4 dims)."""
    from tracing.sites import site_steps

    for step in site_steps(trace, Site(e.site.module, call=e.site.call)):
        if step.outputs:
            return len(trace.tensor(step.outputs[0]).shape) < 4
    return False


def _index_text(index: Any) -> str:
    if isinstance(index, slice):
        return f"{index.start or 0}:{'' if index.stop is None else index.stop}"
    if isinstance(index, int):
        return str(index)
    return ",".join(str(i) for i in index)


def _index_meta(index: Any) -> Any:
    if index is None or isinstance(index, int):
        return index
    if isinstance(index, slice):
        return _index_text(index)
    return [int(i) for i in index]


def as_edit(item: Edit | tuple) -> Edit:
    """An :class:`Edit` from an edit or a ``(site, action[, {options}])`` tuple."""
    if isinstance(item, Edit):
        return item
    if isinstance(item, tuple) and len(item) in (2, 3):
        options = item[2] if len(item) == 3 else {}
        return Edit(item[0], item[1], **options)
    raise TypeError(f"an edit is an Edit or a (site, action) pair, got {item!r}")


def _output_position(names: Sequence[str], which: int | str, site: Site) -> int:
    """Position of the chosen output among a step's outputs (``names`` as recorded)."""
    if isinstance(which, int):
        if which == 0:
            return 0
        for k, name in enumerate(names):
            if name == f"output[{which}]":
                return k
        return which
    for k, name in enumerate(names):
        if name in (which, f"output[{which!r}]", f"output.{which}"):
            return k
    raise EditError(f"output {which!r} is not an output at {site} (its outputs: {list(names)})")


def _pick(output: Any, which: int | str, site: Site) -> tuple[torch.Tensor, Callable]:
    """The tensor an edit changes in a step's result, and how to put a new one back."""
    if isinstance(output, torch.Tensor):
        if which not in (0, "output"):
            raise EditError(f"{site} has one output, a tensor; output={which!r} does not exist")
        return output, lambda new: new
    if isinstance(output, (tuple, list)) and isinstance(which, int):
        if not -len(output) <= which < len(output) or not isinstance(output[which], torch.Tensor):
            raise EditError(f"output {which} at {site} is not a tensor")

        def put(new):
            items = list(output)
            items[which] = new
            return type(output)(items) if type(output) in (tuple, list) else output._make(items)

        return output[which], put
    if isinstance(output, Mapping):
        key = which
        if isinstance(which, int):  # the first tensor in the mapping (HF: "logits")
            keys = [k for k, v in output.items() if isinstance(v, torch.Tensor)]
            if which >= len(keys):
                raise EditError(f"output {which} at {site} is not a tensor")
            key = keys[which]
        value = output.get(key)
        if not isinstance(value, torch.Tensor):
            raise EditError(f"output {key!r} at {site} is not a tensor")

        def put_key(new):
            output[key] = new  # HF ModelOutput and dicts: set in place, same object
            return output

        return value, put_key
    raise EditError(f"{site} returned {type(output).__name__}, which holds no tensor to edit")


# --------------------------------------------------------------------------- a run's plan


@dataclass
class EditPlan:
    """The edits of one run, indexed for the instruments that apply them.

    An instrument calls :meth:`on_module` with a module call's output and :meth:`on_op`
    with each op's result (only for names in :attr:`op_names` / paths in
    :attr:`module_paths`, so a run with edits elsewhere pays one set lookup per step).
    The plan counts op occurrences per module call, applies the matching edits and
    remembers where each one applied.
    """

    edits: list[Edit]
    op_names: frozenset[str] = frozenset()
    module_paths: frozenset[str] = frozenset()
    op_modules: frozenset[str] = frozenset()
    call_names: frozenset[str] = frozenset()  # ops whose whole call an edit replaces
    whole_run: bool = False  # an instrument's op mode must run through the whole forward
    applied: list[list[int]] = field(default_factory=list)  # per edit: steps (or calls)
    calls_seen: dict[str, set[int]] = field(default_factory=dict)
    _on_module: dict[str, list[int]] = field(default_factory=dict)
    _on_op: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    _on_call: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    _bound: Any = None  # the model check_model last sorted the edits for
    _counts: dict[tuple[str, int, str], int] = field(default_factory=dict)
    _heads: torch.Tensor | None = None  # see take_heads

    @classmethod
    def of(cls, edits: EditPlan | Iterable[Edit | tuple]) -> EditPlan:
        if isinstance(edits, EditPlan):
            return edits
        plan = cls([as_edit(e) for e in edits])
        plan._sort()
        plan.reset()
        return plan

    def _sort(self, named: Mapping[str, nn.Module] | None = None) -> None:
        """Index the edits by where they apply: a module's output, an op, or (``head=`` on
        an ``nn.MultiheadAttention``, once the model is known) the attention's whole call."""
        from tracing.capture.heads import MHA_OP

        self._on_module, self._on_op, self._on_call = {}, {}, {}
        for i, e in enumerate(self.edits):
            path = e.site.module
            if e.site.op is not None:
                self._on_op.setdefault((path, e.site.op), []).append(i)
            elif named is not None and _mha_head_edit(e, named.get(path)):
                self._on_call.setdefault((path, MHA_OP), []).append(i)
            else:
                self._on_module.setdefault(path, []).append(i)
        self._index()

    def _index(self) -> None:
        self.module_paths = frozenset(self._on_module)
        ops = [*self._on_op, *self._on_call]
        self.op_names = frozenset(op for _, op in ops)
        self.op_modules = frozenset(module for module, _ in ops)
        self.call_names = frozenset(op for _, op in self._on_call)
        self.whole_run = bool(self._on_call)

    def reset(self) -> None:
        """Forget what the last run did (a plan can serve many runs)."""
        self.applied = [[] for _ in self.edits]
        self.calls_seen = {}
        self._counts = {}
        self._heads = None

    def check_model(self, model: nn.Module) -> None:
        """Raise :class:`EditError` for a site whose module the model does not have; sort
        the edits for this model (``head=`` on an ``nn.MultiheadAttention`` edits its
        per-head output, inside its call: :mod:`tracing.capture.heads`)."""
        if self._bound is model:
            return
        named = dict(model.named_modules())
        for e in self.edits:
            if e.site.module not in named:
                close = difflib.get_close_matches(e.site.module, list(named), n=3)
                hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
                raise EditError(
                    f"edit site {e.site}: the model has no module {e.site.module!r}{hint}"
                )
        self._sort(named)
        self._bound = model

    def resolve_heads(self, trace: Trace, failed_at: str | None = None) -> bool:
        """Readdress each ``head=`` edit of a module whose output has no heads axis (an
        attention module: a Hugging Face ``LlamaAttention``, our ``MultiHeadAttention``, a
        nanoGPT ``CausalSelfAttention``) to the per-head output that ``trace`` recorded
        inside it (:func:`tracing.capture.heads.resolve_head_edit`); True when one was.
        ``trace`` is a run of the same model, at any capture level; a module it holds no
        call of is left as it is. ``failed_at``: the module whose ``head=`` edit just
        failed for want of a heads axis (a failed trace holds its call, not its output).
        Raises :class:`EditError` naming the sites that work when such a module has no
        per-head output inside, or several."""
        from tracing.capture.heads import resolve_head_edit

        named = dict(self._bound.named_modules()) if self._bound is not None else {}
        changed = False
        for i, e in enumerate(self.edits):
            module = named.get(e.site.module)
            if (
                not _module_head_edit(e)
                or e.via is not None
                or isinstance(module, nn.MultiheadAttention)
                or not (e.site.module == failed_at or _lacks_heads_axis(trace, e))
            ):
                continue
            new = resolve_head_edit(trace, e)
            if new is not None:
                self.edits[i] = new
                changed = True
        if changed:
            self._sort(named or None)
        return changed

    def on_call(
        self, path: str, call: int, name: str, func: Callable, args: tuple, kwargs, step=-1
    ) -> Any:
        """``func(*args, **kwargs)``, op ``name`` run directly in ``path`` (call ``call``),
        with the edits that replace such a call applied (see :attr:`call_names`)."""
        self.calls_seen.setdefault(path, set()).add(call)
        found = [
            i for i in self._on_call.get((path, name), ()) if self.edits[i].site.matches_call(call)
        ]
        if not found:
            return func(*args, **kwargs) if kwargs else func(*args)
        from tracing.capture.heads import edited_mha_call

        def edit(heads: torch.Tensor) -> torch.Tensor:
            for i in found:
                e = self.edits[i]
                self.applied[i].append(step if step >= 0 else call)
                heads = e.edited(heads, Site(e.site.module, None, 0, call), within=name)
            self._heads = heads.detach()  # what the trace records as the call's heads
            return heads

        return edited_mha_call(func, args, kwargs, edit)

    def take_heads(self) -> torch.Tensor | None:
        """The per-head output the last :meth:`on_call` edited, once (then None)."""
        heads, self._heads = self._heads, None
        return heads

    def on_module(self, path: str, call: int, output: Any, step: int = -1) -> Any:
        """The module call's output with this plan's edits for ``path`` applied."""
        self.calls_seen.setdefault(path, set()).add(call)
        for i in self._on_module.get(path, ()):
            edit = self.edits[i]
            if edit.site.matches_call(call):
                output = self._apply(edit, i, output, call, step)
        return output

    def on_op(
        self, path: str, call: int, name: str, result: Any, step: int = -1, inputs: Sequence = ()
    ) -> Any:
        """An op's result with this plan's edits for the ``name`` op in ``path`` applied.

        Call it only for ops that returned a tensor (those make steps, and are counted).
        An in-place op's result (one of its ``inputs``) is edited in place: the model
        holds that tensor, not whatever the op returned.
        """
        found = self._on_op.get((path, name))
        if found is None:
            return result
        key = (path, call, name)
        occurrence = self._counts.get(key, 0)
        self._counts[key] = occurrence + 1
        new = result
        for i in found:
            edit = self.edits[i]
            if edit.site.occurrence == occurrence and edit.site.matches_call(call):
                new = self._apply(edit, i, new, call, step)
        in_place = isinstance(result, torch.Tensor) and any(result is t for t in inputs)
        if new is not result and in_place:
            result.copy_(new)
            return result
        return new

    def _apply(self, edit: Edit, i: int, output: Any, call: int, step: int) -> Any:
        site = Site(edit.site.module, edit.site.op, edit.site.occurrence, call)
        value, put = _pick(output, edit.output, site)
        self.applied[i].append(step if step >= 0 else call)
        return put(edit.edited(value, site))

    def unmatched(self) -> list[Edit]:
        return [e for e, where in zip(self.edits, self.applied) if not where]

    def check_matched(self) -> None:
        """Raise :class:`EditError` naming every edit that applied nowhere in the run."""
        missing = self.unmatched()
        if not missing:
            return
        lines = []
        for e in missing:
            ran = self.calls_seen.get(e.site.module)
            if e.site.op is not None:
                counts = {
                    c: n for (p, c, op), n in self._counts.items()
                    if p == e.site.module and op == e.site.op
                }  # fmt: skip
                seen = (
                    f"{e.site.op} ran {max(counts.values())} time(s) per call there"
                    if counts
                    else f"no {e.site.op!r} op ran directly in {e.site.module or '<root>'}"
                )
            elif not ran:
                seen = f"{e.site.module or '<root>'} never ran"
            else:
                seen = f"{e.site.module or '<root>'} ran {len(ran)} time(s) (calls @0..@{max(ran)})"
            lines.append(f"{e.describe()} matched nothing: {seen}")
        raise EditError("; ".join(lines))

    def to_meta(self) -> list[dict[str, Any]]:
        """What ``trace.meta["edits"]`` keeps: each edit and the steps it changed."""
        return [{**e.to_meta(), "steps": list(where)} for e, where in zip(self.edits, self.applied)]


def edited_steps(trace: Trace) -> dict[int, list[str]]:
    """Step index -> descriptions of the edits applied there (from ``trace.meta``)."""
    found: dict[int, list[str]] = {}
    for entry in trace.meta.get("edits") or ():
        for index in entry.get("steps", ()):
            found.setdefault(int(index), []).append(str(entry.get("describe", entry.get("site"))))
    return found


__all__ = [
    "Action",
    "Add",
    "Apply",
    "Edit",
    "EditContext",
    "EditError",
    "EditPlan",
    "MeanAblate",
    "Patch",
    "Scale",
    "Set",
    "Zero",
    "as_edit",
    "edited_steps",
]
