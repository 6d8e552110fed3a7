"""Sites: addresses of a place in a forward pass that stay the same from one run to the next.

A step index changes whenever a model runs one op more or less; a *site* names the place by
what is there instead, the same way :func:`step_keys` lines steps up (for ``tracing.diff`` too):

- ``"blocks.1.feed_forward"`` — the output of that module (every call of it);
- ``"blocks.0@1"`` — the output of the *second* call of ``blocks.0`` only (``@0`` is the
  first call);
- ``"blocks.1.self_attn.attention:softmax#0"`` — the output of the first ``softmax`` op run
  directly in that module (not in one of its submodules), in every call of it;
- ``"blocks.1@1:add#1"`` — the second ``add`` of the second call of ``blocks.1``.

``""`` or ``"<root>"`` is the model itself. Edits (:mod:`tracing.edits`) and patching sweeps
(:mod:`tracing.patching`) are addressed by sites; :func:`step_site` gives the site of any
step of a trace, and :func:`site_steps` finds the steps a site names.

>>> parse_site("blocks.1.self_attn.attention:softmax#0")
Site(module='blocks.1.self_attn.attention', op='softmax', occurrence=0, call=None)
>>> str(Site("blocks.0", call=1))
'blocks.0@1'
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from tracing.record import Step, Trace

_SITE = re.compile(
    r"^(?P<module>[^@:#\s]*)"  # dotted module path ("" for the root)
    r"(?:@(?P<call>\d+))?"  # which call of the module (all calls when absent)
    r"(?::(?P<op>[A-Za-z_][\w.]*)(?:#(?P<occurrence>\d+))?)?$"  # an op and which one
)


@dataclass(frozen=True)
class Site:
    """A module's output (``op is None``) or the ``occurrence``-th ``op`` run directly in
    that module; in every call of the module (``call is None``) or in one call."""

    module: str
    op: str | None = None
    occurrence: int = 0
    call: int | None = None

    def __str__(self) -> str:
        text = self.module or "<root>"
        if self.call is not None:
            text += f"@{self.call}"
        if self.op is not None:
            text += f":{self.op}#{self.occurrence}"
        return text

    def matches_call(self, call: int) -> bool:
        return self.call is None or self.call == call


def parse_site(site: str | Site) -> Site:
    """The :class:`Site` a string names; one clear ``ValueError`` for a malformed one."""
    if isinstance(site, Site):
        return site
    if not isinstance(site, str):
        raise TypeError(f"a site is a string such as 'blocks.1.feed_forward', got {site!r}")
    text = site.strip()
    if text.startswith("<root>"):
        text = text[len("<root>") :]
    found = _SITE.match(text)
    if found is None:
        raise ValueError(
            f"cannot read site {site!r}: expected 'module', 'module@call', "
            "'module:op#n' or 'module@call:op#n' (e.g. 'blocks.1.self_attn.attention:softmax#0')"
        )
    call = found["call"]
    occurrence = found["occurrence"]
    return Site(
        module=found["module"],
        op=found["op"],
        occurrence=int(occurrence) if occurrence else 0,
        call=int(call) if call is not None else None,
    )


def step_site(trace: Trace, step: Step | int, with_call: bool = True) -> Site:
    """The site of a step of ``trace``: its module (and call) for a module step, its module,
    op and occurrence within that module call for an op step."""
    index = step if isinstance(step, int) else step.index
    kind, module, op, call, occurrence = step_keys(trace)[index]
    return Site(
        module=module,
        op=op if kind == "op" else None,
        occurrence=occurrence if kind == "op" else 0,
        call=call if with_call else None,
    )


def site_steps(trace: Trace, site: str | Site) -> list[Step]:
    """Every step of ``trace`` that ``site`` names (one per matching module call)."""
    site = parse_site(site)
    found = []
    for step, (kind, module, op, call, occurrence) in zip(trace.steps, step_keys(trace)):
        if module != site.module or not site.matches_call(call):
            continue
        if site.op is None:
            if kind == "module":
                found.append(step)
        elif kind == "op" and op == site.op and occurrence == site.occurrence:
            found.append(step)
    return found


__all__ = ["Site", "parse_site", "site_steps", "step_site"]


StepKey = tuple[str, str, str, int, int]
"""``(kind, module, op, call, occurrence)``: a step's place, the same in another run."""


def step_keys(trace: Trace) -> list[StepKey]:
    """The alignment key of every step: ``(kind, module, op, call, occurrence)``.

    For an op, ``call`` is the call number of the module call it ran in, so the ops of the
    second call of a shared module line up with the second call on the other side.
    """
    steps = trace.steps
    seen: Counter = Counter()
    keys: list[StepKey] = []
    for s in steps:
        if s.kind == "module":
            call = s.call
        elif s.parent is not None and 0 <= s.parent < len(steps):
            call = steps[s.parent].call
        else:
            call = 0
        base = (s.kind, s.module, s.op, call)
        keys.append((*base, seen[base]))
        seen[base] += 1
    return keys
