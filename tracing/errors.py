"""Errors the tracing package raises. Each names the problem in plain words."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from tracing.record import Trace


class TraceError(RuntimeError):
    """The traced forward pass raised.

    Raised ``from`` the original exception. ``.trace`` holds everything recorded up to and
    including the failing step, because that is exactly when a person needs the debugger.
    """

    def __init__(self, message: str, trace: Trace):
        super().__init__(message)
        self.trace = trace


class TraceFileError(ValueError):
    """A trace file cannot be read: truncated, foreign, a newer schema, inconsistent."""


class ReentrantCheckpointError(RuntimeError):
    """``trace_step`` met a reentrant ``torch.utils.checkpoint`` block (``use_reentrant=True``,
    or no ``use_reentrant`` given): its inside runs without autograd, so its gradients cannot
    be recorded. Raised before any backward or optimizer step; nothing was changed."""
