"""Training a model from the user's own file: how it is called, and what its loss is.

One answer for ``scratchformer train --model FILE.py:NAME`` and the app's File ▸ New
trace ▸ Training step (no Qt here):

- **The loss.** A function given (``--loss FILE.py:NAME``, or a ``loss`` function in the
  model's file for the app) is called as ``loss(output, targets)``. Without one, the
  *default loss* reads the model the way language models are written:

  - a model whose ``forward`` takes ``targets`` (nanoGPT: ``forward(idx, targets=None)``
    returns ``(logits, loss)``) or ``labels`` (Hugging Face) is called with them, and its
    own loss is the loss;
  - otherwise an output with ``.loss`` gives it; else the logits (the output, its
    ``.logits``, or its first element) shaped ``(B, T, V)`` against targets ``(B, T)``
    give the next-token cross-entropy.

  A shape that does not fit is one :class:`LossShapeError` saying what was expected.
- **The data.** ``--text FILE`` (byte tokens, random windows) or ``--data FILE.py:NAME``:
  a function of the step number (1 for the first) returning ``(inputs, targets)``, or an
  iterable of such pairs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

TARGET_PARAMETERS = ("targets", "labels")
"""Names of a ``forward`` parameter that takes the targets (nanoGPT, Hugging Face)."""


class LossShapeError(ValueError):
    """The loss or the batch does not fit the model's output: one line saying what shape
    was expected and what came."""


def targets_parameter(model: Any) -> str | None:
    """The name of the model's ``forward`` parameter for targets, or None."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return None
    return next((name for name in TARGET_PARAMETERS if name in params), None)


def logits_of(output: Any) -> Any:
    """The logits in a model's output: the output, its ``.logits`` / ``["logits"]``, or
    the first element of a tuple."""
    import torch

    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and "logits" in output:
        return output["logits"]
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, (tuple, list)) and output:
        logits = output[0]
    return logits


def own_loss(output: Any) -> Any:
    """The loss a model computed itself: ``.loss`` / ``["loss"]``, or the last element of
    ``(logits, loss)``; None when it computed none."""
    import torch

    if isinstance(output, dict):
        return output.get("loss")
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, (tuple, list)) and len(output) >= 2:
        last = output[-1]
        loss = last if isinstance(last, torch.Tensor) and last.numel() == 1 else None
    return loss


def next_token_loss(output: Any, targets: Any) -> Any:
    """The default loss: the output's own loss if it has one, else the cross-entropy of
    its ``(B, T, V)`` logits against the ``(B, T)`` targets."""
    import torch
    import torch.nn.functional as F

    loss = own_loss(output)
    if loss is not None:
        return loss
    logits = logits_of(output)
    if not isinstance(logits, torch.Tensor):
        raise LossShapeError(
            f"the default loss expects the model to return logits shaped (B, T, V) (a tensor,"
            f" .logits, or (logits, loss)); it returned a {type(output).__name__}. Give a loss:"
            " --loss FILE.py:NAME, loss(output, targets) -> a scalar"
        )
    if not isinstance(targets, torch.Tensor):
        raise LossShapeError(
            f"the default loss expects targets as a tensor of token ids (B, T), got "
            f"{type(targets).__name__}"
        )
    want = tuple(targets.shape)
    if logits.dim() != targets.dim() + 1 or tuple(logits.shape[:-1]) != want:
        v = logits.shape[-1] if logits.dim() else "V"
        raise LossShapeError(
            f"the default loss expects logits shaped (B, T, V) = {(*want, v)} for targets "
            f"{want}, got logits {tuple(logits.shape)}"
            + (
                " (the model returns only the last position's logits unless it is given "
                "targets: name its forward parameter 'targets')"
                if logits.dim() == 3 and logits.shape[1] == 1 and want[-1] != 1
                else ""
            )
            + "; or give a loss: --loss FILE.py:NAME"
        )
    if targets.dtype not in (torch.int64, torch.int32, torch.uint8, torch.int16):
        raise LossShapeError(f"the default loss expects integer token ids, got {targets.dtype}")
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten().long())


@dataclass
class StepPlan:
    """How one training step calls the model and gets its loss.

    ``call(model, inputs, targets)`` runs the model; ``loss(output, targets)`` is the
    loss (None: the output holds it, the model computed it from the targets it was given,
    and the loss is among the model's own steps)."""

    call: Callable[[Any, Any, Any], Any]
    loss: Callable[[Any, Any], Any] | None
    describe: str


def plan(model: Any, loss_fn: Callable[[Any, Any], Any] | None = None) -> StepPlan:
    """How to train ``model``: with the user's ``loss_fn(output, targets)``, else the
    default loss (see the module's docstring)."""
    param = targets_parameter(model)
    if loss_fn is not None:
        return StepPlan(lambda m, x, y: m(x), _checked(loss_fn), "the given loss")
    if param is not None:

        def call(m, x, y):
            return m(x, **{param: y})

        return StepPlan(call, None, f"the model's own loss (forward(..., {param}=targets))")
    return StepPlan(lambda m, x, y: m(x), next_token_loss, "next-token cross-entropy")


def _checked(loss_fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``loss_fn`` whose result is checked to be one number."""
    import torch

    def loss(output, targets):
        got = loss_fn(output, targets)
        if not isinstance(got, torch.Tensor) or got.numel() != 1:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise LossShapeError(f"the loss must return a scalar tensor (shape ()), got {shape}")
        return got

    loss.__name__ = getattr(loss_fn, "__name__", "loss")
    return loss


def batches(source: Any) -> Callable[[int], tuple[Any, Any]]:
    """``next_batch(step)`` from a ``--data`` object: a function of the step number, or
    an iterable of ``(inputs, targets)``; each batch checked to be a pair."""
    if callable(source) and not hasattr(source, "__next__"):
        get = source
    else:
        it: Iterator = iter(source)

        def get(step: int):
            try:
                return next(it)
            except StopIteration:
                raise LossShapeError(f"--data ran out of batches at step {step}") from None

    def next_batch(step: int) -> tuple[Any, Any]:
        batch = get(step)
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise LossShapeError(
                f"--data should give (inputs, targets) pairs; step {step} gave "
                f"{type(batch).__name__}"
                + (f" of {len(batch)}" if hasattr(batch, "__len__") else "")
            )
        return batch[0], batch[1]

    return next_batch


__all__ = [
    "LossShapeError",
    "StepPlan",
    "batches",
    "logits_of",
    "next_token_loss",
    "own_loss",
    "plan",
    "targets_parameter",
]
