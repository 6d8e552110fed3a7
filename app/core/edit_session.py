"""What the app's edit actions do, without the windows: build an edit for a step or a head,
re-trace the live model with edits, read the change in the prediction, run a sweep.

Edits need the *live model*: the source (demo, preset, checkpoint) and prompt that made
the window's trace, kept as its :class:`~app.core.session.TraceRequest`. A trace opened from a
file has none, and :func:`missing_model` says what to do instead. The Qt layer
(``app.panels.edits``) runs these functions off the GUI thread and shows their results.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from app.core.session import (
    ProgressCallback,
    SessionError,
    TraceOutcome,
    TraceRequest,
    build_model,
    encode_prompt,
    run_trace,
)
from tracing.capture.edits import Action, Edit, EditError, MeanAblate, Patch, Scale, Zero
from tracing.formatting import step_text
from tracing.sites import step_site

if TYPE_CHECKING:  # pragma: no cover
    from tracing import Trace
    from tracing.runs.patching import SweepResult

ACTIONS = ("zero", "mean", "scale", "patch", "patch_file")
"""The edit actions the app offers, in menu order."""


def missing_model(request: TraceRequest | None, trace: Trace | None = None) -> str | None:
    """Why edits cannot run on the window's trace, or None when they can. A trace that
    ``tracing.show`` could not open in-process says how to get the live model there,
    never suggesting a bundled model instead of the user's."""
    meta = trace.meta if trace is not None else {}
    if request is None and meta.get("shown_by") == "tracing.show":
        return (
            "This window shows a saved copy of your model's trace: tracing.show could not "
            f"open the app in your process ({meta.get('shown_why') or 'no Qt event loop'}). "
            "To edit your model live, call tracing.show(model, x) from a script run with "
            "python, or in IPython/Jupyter run %gui qt first."
        )
    if request is None:
        return (
            "Edits re-run the model, and this trace was opened from a file: the file keeps "
            "what the model did, not the model. Trace it live with File ▸ New trace… (the "
            "bundled demo, a preset or a checkpoint), then edit that trace."
        )
    return None


# --------------------------------------------------------------------------- edits


class PatchFromPrompt(Action):
    """Patch with the values of the same model on another prompt, traced when the edits
    run (:func:`run_edits`), not when the menu entry is chosen."""

    def __init__(self, prompt: str):
        self.prompt = prompt
        self.source: Trace | None = None

    def apply(self, value, ctx):
        if self.source is None:
            raise EditError(f"the run on {self.prompt!r} to patch from has not been traced")
        return Patch(self.source).apply(value, ctx)

    def describe(self) -> str:
        return f"Patch(from {self.prompt!r})"


def make_action(kind: str, scale: float = 0.0, source: Any = None) -> Action:
    """The :class:`~tracing.edits.Action` behind a menu entry."""
    if kind == "zero":
        return Zero()
    if kind == "mean":
        return MeanAblate("positions")
    if kind == "scale":
        return Scale(float(scale))
    if kind in ("patch", "patch_file"):
        if source is None:
            raise SessionError("Patch needs the other trace to take values from.")
        return source if isinstance(source, PatchFromPrompt) else Patch(source)
    raise SessionError(f"Unknown edit {kind!r}; choose one of {', '.join(ACTIONS)}")


def edit_for_step(trace: Trace, index: int, action: Action) -> Edit:
    """An edit of step ``index``'s (first) output, addressed by its site (this call only)."""
    step = trace.steps[index]
    if not step.outputs:
        raise SessionError(f"{step_text(index)} ({step.label}) has no output to edit")
    return Edit(step_site(trace, step), action)


def edit_for_head(trace: Trace, map_step: int, head: int, action: Action) -> Edit:
    """An edit of one head's output in the layer whose attention map step ``map_step``
    computed: the per-head output ``(B, H, T, D)`` that the map multiplies into."""
    from tracing.runs.patching import head_site_for_map

    found = head_site_for_map(trace, map_step)
    if found is None:
        raise SessionError(
            f"cannot find the per-head output of {step_text(map_step)}'s attention map "
            "(no op multiplies it with the values)"
        )
    site, output = found
    return head_edit(trace, trace.steps[map_step].module, site, output, head, action)


def head_edit(trace: Trace, attention: str, site, output: int, head: int, action: Action) -> Edit:
    """The edit of head ``head``'s output at ``site``, described by the attention module
    ``attention`` that made the map when the site is an op in it (``Zero() at
    model.layers.1.self_attn head 4 (its per-head output …:scaled_dot_product_attention#0;
    query head 4; it shares key/value head 1 of 2 with query heads 3-5)``)."""
    from tracing.capture.heads import heads_folded_at, kv_note

    via = attention if site.op is not None and site.module == attention else None
    note = kv_note(trace, site, head)
    folded = heads_folded_at(trace, site, output)
    return Edit(site, action, head=head, output=output, via=via, note=note, heads_folded=folded)


# --------------------------------------------------------------------------- re-running


@dataclass
class EditRequest:
    """Re-trace ``base`` (the window's live request) with ``edits``."""

    base: TraceRequest
    edits: tuple[Edit, ...]


def run_edits(
    request: EditRequest,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
) -> TraceOutcome:
    """The base request traced again with the edits (always at ``values``, so the compare
    view and the prediction change can read every value). A patch from another prompt
    traces that prompt first."""
    check_edits(request.edits)
    for edit in request.edits:
        action = edit.action
        if isinstance(action, PatchFromPrompt) and action.source is None:
            action.source = trace_prompt(request.base, action.prompt, cancel)
    # the forward only (a training step's trace is compared on its forward steps)
    base = replace(request.base, capture="values", edits=tuple(request.edits), training=False)
    outcome = run_trace(base, progress=progress, cancel=cancel)
    if outcome.status == "failed" and outcome.trace is not None:
        outcome.message = outcome.message or "the edited forward pass raised"
    return outcome


def trace_prompt(base: TraceRequest, prompt: str, cancel=None) -> Trace:
    """The same model on another prompt, at ``values`` (a source for Patch)."""
    other = replace(base, prompt=prompt, capture="values", edits=(), training=False)
    outcome = run_trace(other, cancel=cancel)
    if outcome.trace is None or outcome.status != "complete":
        raise SessionError(outcome.message or f"cannot trace {prompt!r}")
    return outcome.trace


def check_edits(edits: tuple[Edit, ...]) -> None:
    """Raise SessionError for an edit list that cannot run (none enabled)."""
    if not edits:
        raise SessionError("No edit is enabled: tick one in the Edits panel, then re-run.")


# --------------------------------------------------------------------------- prediction


@dataclass(frozen=True)
class PredictionRow:
    """One token of the top-k before or after: its label and probabilities."""

    token: int
    label: str
    before: float
    after: float
    logit_before: float = 0.0
    logit_after: float = 0.0

    @property
    def change(self) -> float:
        return self.after - self.before

    @property
    def logit_change(self) -> float:
        return self.logit_after - self.logit_before


def final_logits(trace: Trace) -> Any | None:
    """The root call's first output when its values were kept and it is (B, T, V); else
    None."""
    if not trace.steps or trace.steps[0].kind != "module" or not trace.steps[0].outputs:
        return None
    logits = trace.value(trace.steps[0].outputs[0])
    if logits is None or logits.dim() != 3:
        return None
    return logits


def final_probabilities(trace: Trace) -> Any | None:
    """Next-token probabilities at the last position (first batch row), from the root
    call's first output when its values were kept; None otherwise."""
    import torch

    logits = final_logits(trace)
    return None if logits is None else torch.softmax(logits[0, -1].double(), dim=-1)


@dataclass(frozen=True)
class OutputChange:
    """How far the edited run's output moved: ``identical`` when every logit (every
    position) is bit-for-bit the same; ``kl`` is KL(before ‖ after) of the next-token
    distributions at the last position, in nats; ``max_logit_change`` the largest
    |Δlogit| there."""

    identical: bool
    kl: float
    max_logit_change: float


def output_change(before: Trace, after: Trace) -> OutputChange | None:
    """The figures of :class:`OutputChange`, or None when either trace kept no logits."""
    import torch

    a, b = final_logits(before), final_logits(after)
    if a is None or b is None or a.shape != b.shape:
        return None
    identical = bool(torch.equal(a, b))
    la = torch.log_softmax(a[0, -1].double(), dim=-1)
    lb = torch.log_softmax(b[0, -1].double(), dim=-1)
    kl = float((la.exp() * (la - lb)).sum().clamp_min(0.0))
    delta = float((b[0, -1].double() - a[0, -1].double()).abs().max())
    return OutputChange(identical, 0.0 if identical else kl, 0.0 if identical else delta)


def prediction_change(
    before: Trace, after: Trace, label=None, k: int = 5
) -> list[PredictionRow] | None:
    """The top ``k`` next tokens of either run, with their probability before and after
    (sorted by the larger of the two); None when either trace kept no logits."""
    p, q = final_probabilities(before), final_probabilities(after)
    if p is None or q is None or p.shape != q.shape:
        return None
    label = label or (lambda t: str(t))
    top = set(p.topk(min(k, p.numel())).indices.tolist())
    top |= set(q.topk(min(k, q.numel())).indices.tolist())
    la, lb = final_logits(before)[0, -1], final_logits(after)[0, -1]
    rows = [
        PredictionRow(t, label(t), float(p[t]), float(q[t]), float(la[t]), float(lb[t]))
        for t in top
    ]
    rows.sort(key=lambda r: -max(r.before, r.after))
    return rows[: max(k, 2)]


def prediction_summary(rows: list[PredictionRow] | None) -> str:
    """``'d' 99.9% → 'k' 61.2% (p('d') -38.7 pp)``: the top token before and after and the
    change of the first one's probability in percentage points (``+0.00123 pp``, never a
    rounded ``+0.0%``), or why it is unknown."""
    if not rows:
        return "no prediction (the traces kept no logits)"
    first = max(rows, key=lambda r: r.before)
    second = max(rows, key=lambda r: r.after)
    c = first.change * 100  # percentage points, with the digits a small change needs
    change = "unchanged" if c == 0 else f"{c:+.3g} pp"
    return (
        f"{first.label!r} {first.before:.1%} → {second.label!r} {second.after:.1%}"
        f" (p({first.label!r}) {change})"
    )


# --------------------------------------------------------------------------- sweeps


@dataclass
class SweepRequest:
    """A patching sweep of the live model: ``corrupted`` patched from ``clean``."""

    base: TraceRequest
    clean: str
    corrupted: str
    over: str = "heads"


def run_sweep(
    request: SweepRequest,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
) -> SweepResult:
    """Build the model, encode both prompts (same length) and sweep."""
    import torch

    from tracing.runs.patching import sweep

    if request.base.source.kind == "file":
        raise SessionError(
            "A sweep patches one prompt's run into another's, so it needs a model that "
            "reads the prompt (the demo, a preset, a checkpoint). For your own model call "
            "tracing.patching.sweep(model, clean_inputs, corrupted_inputs) from Python."
        )
    model, tokenizer = build_model(request.base.source)
    clean = encode_prompt(tokenizer, request.clean, model)
    corrupted = encode_prompt(tokenizer, request.corrupted, model)
    if clean.shape != corrupted.shape:
        raise SessionError(
            f"The clean prompt is {clean.shape[1]} tokens and the corrupted one "
            f"{corrupted.shape[1]}: patching needs prompts of the same length."
        )
    try:
        with torch.no_grad():
            return sweep(
                model,
                clean,
                corrupted,
                over=request.over,
                progress=progress,
                cancel=cancel,
                token_label=getattr(tokenizer, "token_str", None),
            )
    except (EditError, ValueError) as e:
        raise SessionError(str(e)) from e


__all__ = [
    "ACTIONS",
    "EditRequest",
    "OutputChange",
    "PatchFromPrompt",
    "PredictionRow",
    "SweepRequest",
    "edit_for_head",
    "edit_for_step",
    "make_action",
    "missing_model",
    "output_change",
    "prediction_change",
    "prediction_summary",
    "run_edits",
    "run_sweep",
]
