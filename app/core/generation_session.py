"""Tracing a generation, without Qt: one traced forward pass per new token.

:func:`run_generation` builds the model a :class:`GenerationRequest` names, encodes the
prompt and runs :func:`tracing.generation.trace_generate`, reporting progress per pass and
honouring a cancel flag (the Qt worker :class:`app.workers.GenerationJob` runs it off the
GUI thread). Problems the user can fix raise :class:`app.core.session.SessionError`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

import tracing
from app.core import session
from app.core.session import DEFAULT_CAPTURE, ModelSource, SessionError
from tracing.runs.generation import trace_generate

if TYPE_CHECKING:  # pragma: no cover
    import torch.nn as nn

    from tracing.runs.generation import GenerationTrace

ProgressCallback = Any  # (done: int, total: int) -> None

MAX_NEW_TOKENS = 256


class GenerationCancelled(Exception):
    """Raised inside a pass when the user pressed Cancel."""


@dataclass
class GenerationRequest:
    """What the "Trace generation…" dialog asks for."""

    prompt: str
    max_new_tokens: int = 8
    source: ModelSource = field(default_factory=ModelSource)
    capture: str = DEFAULT_CAPTURE
    temperature: float = 0.0  # 0: greedy (argmax), like generate(temperature=0)


@dataclass
class GenerationOutcome:
    generation: GenerationTrace | None
    model: nn.Module | None = None
    status: Literal["complete", "cancelled"] = "complete"


def run_generation(
    request: GenerationRequest,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
) -> GenerationOutcome:
    """Build the model, encode the prompt and trace ``max_new_tokens`` passes.

    Progress counts passes (a pre-hook on the root module sees each one start); once
    ``cancel`` is set the next pass raises :class:`GenerationCancelled` and the outcome is
    ``"cancelled"``. Problems the user can fix raise :class:`app.core.session.SessionError`.
    """
    if not 1 <= request.max_new_tokens <= MAX_NEW_TOKENS:
        raise SessionError(
            f"Generate between 1 and {MAX_NEW_TOKENS} new tokens "
            f"(asked for {request.max_new_tokens})."
        )
    if request.capture not in tracing.CAPTURE_LEVELS:
        raise SessionError(f"Unknown capture level {request.capture!r}")
    model, tokenizer = session.build_model(request.source)
    ids = session.encode_prompt(tokenizer, request.prompt, model)  # (B=1, T)
    total = request.max_new_tokens
    passes = 0

    def pre_hook(_module: torch.nn.Module, _args: Any) -> None:
        nonlocal passes
        if cancel is not None and cancel.is_set():
            raise GenerationCancelled()
        if progress is not None:
            progress(passes, total)
        passes += 1

    decode = getattr(tokenizer, "decode", None)
    handle = model.register_forward_pre_hook(pre_hook)
    try:
        generation = trace_generate(
            model,
            ids,
            request.max_new_tokens,
            temperature=request.temperature,
            generator=torch.Generator().manual_seed(0),
            capture=request.capture,
            decode=decode,
            meta={"model_source": request.source.describe()},
        )
    except tracing.TraceError as e:
        if session.caused_by(e, GenerationCancelled):
            return GenerationOutcome(None, None, "cancelled")
        raise SessionError(f"The forward pass raised during generation: {e}") from e
    except GenerationCancelled:
        return GenerationOutcome(None, None, "cancelled")
    finally:
        handle.remove()
    if progress is not None:
        progress(total, total)
    return GenerationOutcome(generation, model, "complete")
