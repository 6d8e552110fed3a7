"""Watch a training loop you wrote and save a training-step trace of the step that matters.

>>> watcher = tracing.watch(model, optimizer, when="nonfinite", path="bad_step.trace",
...                         loss_fn=lambda out: F.cross_entropy(out.flatten(0, 1), y.flatten()))
>>> for x, y in batches:                        # your loop, unchanged  # doctest: +SKIP
...     optimizer.zero_grad()
...     loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
...     loss.backward()
...     optimizer.step()
>>> watcher.close()                                                     # doctest: +SKIP

How it works, and what it costs when it does not fire: a forward pre-hook on the model
keeps a reference to the last call's arguments and a copy of the CPU random state (a
few microseconds), and a step pre-hook on the optimizer counts steps and, for
``when="nonfinite"``, checks every gradient with one ``torch._foreach_norm(grads, inf)``
pass (NaN and Inf propagate into the max). That check runs *before* the optimizer moves
the weights, so when it fires the model and optimizer are still in the state the bad
step started from: the step is replayed from there under :func:`tracing.trace_step`
(same arguments, same random state, so bit for bit the same forward and gradients),
streamed to ``path``, and the loop's own gradients are put back before its ``step()`` goes on.

``loss_fn(output)`` gives the loss from the model's output; a lambda that reads the
loop's current targets (``y`` above) works, as it is called during that step. Without
it the output must be the loss, hold ``.loss`` / ``["loss"]``, or end with it (a
``(logits, loss)`` tuple). The replay assumes the loop zeroes the gradients before each
step (``zero_grad()``), as nearly every loop does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tracing.capture.distributed import output_path
from tracing.runs.backward import loss_fn_name, loss_from_output, record_step
from tracing.safe_text import exception_text

When = str | int | Callable[[int], bool]


class Watcher:
    """What :func:`watch` returns: hooks on a model and its optimizer until :meth:`close`
    (or the end of a ``with`` block). ``traces`` lists the files saved, ``step`` counts
    the optimizer steps seen (1 for the first)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        when: When,
        path: str | Path,
        loss_fn: Callable[[Any], Any] | None,
        capture: str,
        once: bool,
        trace_options: dict[str, Any],
    ):
        if not (when == "nonfinite" or isinstance(when, int) or callable(when)):
            raise ValueError(
                f"when must be 'nonfinite', a step number or a function of the step, got {when!r}"
            )
        self.model, self.optimizer, self.when = model, optimizer, when
        self.path = Path(path)
        self.loss_fn = loss_fn or loss_from_output
        self.loss_type = None if loss_fn is None else loss_fn_name(loss_fn)  # its own step
        self.capture, self.once, self.options = capture, once, trace_options
        self.step = 0
        self.traces: list[Path] = []
        self.reasons: list[str] = []
        self._call: tuple[tuple, dict] | None = None
        self._rng: torch.Tensor | None = None
        self._replaying = False
        self._handles = [
            model.register_forward_pre_hook(self._remember, with_kwargs=True),
            optimizer.register_step_pre_hook(self._before_step),
        ]

    # ---- hooks

    def _remember(self, module, args, kwargs):
        if not self._replaying and torch.is_grad_enabled():
            self._call = (args, kwargs)
            self._rng = torch.get_rng_state()

    def _before_step(self, optimizer, args, kwargs):
        if self._replaying:
            return
        self.step += 1
        reason = self._reason()
        if reason is None:
            return
        self._replay(reason)
        if self.once:
            self.close()

    def _reason(self) -> str | None:
        when, step = self.when, self.step
        if when == "nonfinite":
            grads = [p.grad for g in self.optimizer.param_groups for p in g["params"]]
            grads = [g for g in grads if g is not None]
            if grads and not bool(
                torch.stack(torch._foreach_norm(grads, float("inf"))).isfinite().all()
            ):
                return f"a non-finite gradient at step {step}"
            return None
        if isinstance(when, int):
            return f"step {step}" if step == when else None
        return f"step {step} (when)" if when(step) else None

    # ---- the replay

    def _replay(self, reason: str) -> None:
        if self._call is None:
            raise RuntimeError("tracing.watch saw no forward with grad before this step")
        args, kwargs = self._call
        model = self.model
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        kept = [p.grad for p in params]  # the loop's gradients (clipped, maybe)
        rng_now = torch.get_rng_state()
        self._replaying = True
        try:
            for p in params:
                p.grad = None
            torch.set_rng_state(self._rng)
            path = output_path(self._path_for(self.step))  # a rank's own file under DDP
            try:
                record_step(  # streamed to the file as it records
                    model,
                    lambda: model(*args, **kwargs),
                    self.loss_fn,
                    loss_type=self.loss_type,
                    capture=self.capture,
                    meta={"watch": {"step": self.step, "reason": reason}},
                    out=path,
                    **self.options,
                )
            except BaseException as e:  # the replay raised or exited: its file is kept
                if getattr(e, "trace", None) is not None and path.exists():
                    self.traces.append(path)
                    self.reasons.append(f"{reason}; the replay stopped: {exception_text(e)}")
                raise
            self.traces.append(path)
            self.reasons.append(reason)
        finally:
            for p, g in zip(params, kept):
                p.grad = g
            torch.set_rng_state(rng_now)
            self._replaying = False

    def _path_for(self, step: int) -> Path:
        if self.once:
            return self.path
        return self.path.with_name(f"{self.path.stem}.step{step}{self.path.suffix}")

    # ---- lifetime

    def close(self) -> None:
        """Remove the hooks (the model and optimizer are as they were)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self._call = None

    def __enter__(self) -> Watcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def watch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    when: When = "nonfinite",
    path: str | Path = "watched_step.trace",
    *,
    loss_fn: Callable[[Any], Any] | None = None,
    capture: str = "stats",
    once: bool = True,
    **trace_options: Any,
) -> Watcher:
    """Watch a training loop; save a :func:`tracing.trace_step` trace of a step to ``path``.

    ``when``: ``"nonfinite"`` (the first step whose gradients hold a NaN or an Inf — the
    step itself, replayed from the state before it, not the one after), a step number
    (1 = the first ``optimizer.step()``), or a function ``when(step) -> bool``. With
    ``once=False`` every matching step is saved, as ``path``'s stem + ``.stepN``.
    ``trace_options`` go to the trace (``value_cap``, ``value_dtype``, ``break_on``...).
    """
    return Watcher(model, optimizer, when, path, loss_fn, capture, once, trace_options)


__all__ = ["Watcher", "watch"]
