"""Pairing the steps of an extra pass with the real trace's, in one linear walk.

An extra pass runs the same model at other sizes; its steps are the real trace's steps
again, in the same order, where the model's control flow does not depend on the sizes. Where
it does — a loop over the tokens, a mixture of experts whose routing moves — a step is
paired by what it is, not where it falls: the *k*-th step of a kind (module, op, line) in
the real trace with the *k*-th step of that kind in the other pass. That is one dictionary
lookup a step, so a 50,000-step loop costs ten times a 5,000-step one (a sequence diff, as
``difflib`` does, costs a hundred times). A step with no partner gives no evidence; it is
never paired with a step of another kind.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from tracing.record import Step, TensorRecord


def step_kind(step: Step) -> tuple:
    """What a step is, whatever its place: its kind, module, op and the line that ran it.
    (Not its arity: a ``stack`` of T tensors is the same step at another T. The line keeps
    a loop's steps apart from those after the loop; the root call's line is its caller's,
    another in every pass, so it does not count.)"""
    source = step.source
    line = (source.file, source.line) if source is not None and step.parent is not None else None
    return (step.kind, step.module, step.op, line)


def _same_kind(a: Step, b: Step) -> bool:
    """``step_kind(a) == step_kind(b)``, read without building either."""
    if a.op != b.op or a.module != b.module or a.kind != b.kind:
        return False
    if a.parent is None or b.parent is None:  # the root call: its line does not count
        return step_kind(a) == step_kind(b)
    sa, sb = a.source, b.source
    if sa is None or sb is None:
        return sa is sb
    return sa.line == sb.line and sa.file == sb.file


def pair_steps(mine: Sequence[Step], theirs: Sequence[Step]) -> list[tuple[int, int]]:
    """``(index in mine, index in theirs)`` for every step that has a partner: the same
    position where both runs took the same path, else the same occurrence of its kind."""
    if len(mine) == len(theirs) and all(map(_same_kind, mine, theirs)):
        return list(zip(range(len(mine)), range(len(mine))))  # the same path: in order
    kinds = [step_kind(s) for s in mine]
    other = [step_kind(s) for s in theirs]
    where: dict[tuple, list[int]] = {}
    for j, kind in enumerate(other):
        where.setdefault(kind, []).append(j)
    seen: dict[tuple, int] = {}
    pairs = []
    for i, kind in enumerate(kinds):
        k = seen.get(kind, 0)
        seen[kind] = k + 1
        found = where.get(kind)
        if found is not None and k < len(found):
            pairs.append((i, found[k]))
    return pairs


def aligned_shapes(
    steps: Sequence[Step],
    tensors: Sequence[TensorRecord],
    other_steps: Sequence[Step],
    other_shapes: Sequence[tuple[int, ...]],
) -> list[tuple[int, ...] | None]:
    """Per tensor of the real trace, its shape in the other pass (``None``: not paired).
    Paired steps pair their outputs by position, and their inputs by position; a tensor
    keeps the first shape it is given, and only one with as many axes as its own."""
    out: list[tuple[int, ...] | None] = [None] * len(tensors)
    n = len(other_shapes)
    for a, b in pair_steps(steps, other_steps):
        sa, sb = steps[a], other_steps[b]
        # outputs with outputs, inputs with inputs: a split into T parts has as many
        # outputs as T in each run, and its input is never one of the other run's parts
        for ra, rb in itertools.chain(zip(sa.outputs, sb.outputs), zip(sa.inputs, sb.inputs)):
            if out[ra] is None and rb < n:
                shape = other_shapes[rb]
                if len(shape) == len(tensors[ra].shape):
                    out[ra] = shape
    return out


def fill_repeats(
    steps: Sequence[Step],
    tensors: Sequence[TensorRecord],
    shapes: list[tuple[int, ...] | None],
    cut: tuple[str, int],
) -> list[tuple[int, ...] | None]:
    """``shapes`` where a pass stopped at layer ``cut`` of a stack (its later layers repeat
    earlier ones: :func:`tracing.dims.passes.repeat_cut`): each later layer whose steps are
    a run layer's again — the same ops on the same lines, with the same shapes in the real
    trace (a sliding-window layer repeats the last sliding one) — takes that layer's shapes
    in the pass, step by step. A layer like none that ran keeps ``None``: no evidence,
    never a guess."""
    stack, index = cut
    prefix = f"{stack}." if stack else ""
    layers: dict[int, list[Step]] = {}
    for step in steps:
        if step.kind == "backward" or not step.module.startswith(prefix):
            continue
        head, _, _ = step.module[len(prefix) :].partition(".")
        if head.isdigit():
            layers.setdefault(int(head), []).append(step)

    def what(step: Step) -> tuple:
        rest = step.module[len(prefix) :].partition(".")[2]
        line = step.source.line if step.source is not None else None
        outs = tuple(tensors[r].shape for r in step.outputs)
        ins = tuple(tensors[r].shape for r in step.inputs)
        return (step.kind, rest, step.op, line, outs, ins)

    ran: dict[tuple, list[Step]] = {}  # each kind of layer the pass ran: its latest run
    for k in sorted(layers):
        if k < index:
            ran[tuple(what(s) for s in layers[k])] = layers[k]
    out = list(shapes)
    for k, layer in layers.items():
        source = ran.get(tuple(what(s) for s in layer)) if k >= index else None
        if source is None:
            continue
        for mine, theirs in zip(layer, source):
            for a, b in zip(mine.outputs, theirs.outputs):
                if out[a] is None:
                    out[a] = shapes[b]
    return out
