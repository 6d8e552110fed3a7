"""What the debugger does, without the windows: load a demo, trace a prompt, open a file, step.

Everything here is plain Python so it can be tested without a display. The Qt layer
(``app.windows.main_window``) calls these functions and turns their errors into dialogs.

Three ways a trace arrives:

- :func:`demo_trace` traces the bundled demo model on ``DEMO_PROMPT``;
- :func:`run_trace` traces any :class:`ModelSource` on any prompt, reporting progress and
  honouring a cancel flag (the Qt worker in ``app.workers`` runs it off the GUI thread);
- :func:`open_trace` reads a trace file.

A forward pass that raises is not a failure of the debugger: the tracer hands back the
partial trace, and :class:`TraceOutcome` carries it with ``status == "failed"`` so the window
can show it stopped at the failing step. Cancelling is not an error either.

The stepping rules of a debugger (step over, step out, run to the next NaN) are the
functions at the end; they only read ``Trace.steps``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tracing.breakpoints import NonFinite, nonfinite_origin, step_outputs
from tracing.formatting import step_text

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from tracing import Trace

ProgressCallback = Callable[[int, int], None]
"""``progress(done, total)``: module calls so far, modules in the model."""

DEFAULT_CAPTURE = "values"
PRESETS = ("demo", "nano", "gpt2-small")
"""Presets offered in the new-trace dialog (built with random weights, seeded)."""


class SessionError(Exception):
    """A problem the user can fix; the message names it in plain words."""


class Cancelled(Exception):
    """Raised from inside the forward pass when the user pressed Cancel."""


# --------------------------------------------------------------------------- results


@dataclass
class TraceOutcome:
    """The result of tracing: a trace, and whether the forward pass completed."""

    trace: Trace | None
    status: Literal["complete", "failed", "cancelled"] = "complete"
    message: str = ""  # for "failed": the error the forward raised

    @property
    def start_step(self) -> int:
        """Where the window should open: the failing step for a failed trace, else 0."""
        if self.trace is None or not self.trace.steps:
            return 0
        if self.status == "failed":
            return failing_step(self.trace)
        return 0


@dataclass(frozen=True)
class ModelSource:
    """Which model to trace: the bundled demo, a preset with random weights, a checkpoint,
    or the user's own (``model``: ``FILE.py:NAME``, a Hugging Face folder or a config.json,
    see ``app.core.model_sources``)."""

    kind: Literal["demo", "preset", "checkpoint", "file", "live"] = "demo"
    preset: str = "demo"
    checkpoint: str = ""
    seed: int = 0
    model: str = ""  # kind "file": FILE.py:NAME
    input_shape: str = ""  # kind "file": "2,10" traces random inputs instead of the prompt
    input_dtype: str = "long"
    device: str = "cpu"  # kind "file": where the model is built and run (cpu, cuda, meta)
    tokenizer: str = ""  # kind "file": a tokenizer.json for the prompt (default: the model's)
    # kind "live" (``tracing.show(model, x)`` in-process): the user's own object and inputs
    live: Any = field(default=None, compare=False)  # an app.core.user_model.LoadedModel

    def describe(self) -> str:
        if self.kind == "live":
            model = getattr(self.live, "model", None)
            return f"your {type(model).__name__} (live, from tracing.show)"
        if self.kind == "file":
            return self.model
        if self.kind == "checkpoint":
            return Path(self.checkpoint).name
        if self.kind == "preset":
            return f"preset {self.preset} (random weights)"
        return "bundled demo model"

    def reads(self) -> list[Path]:
        """Every file tracing this source reads (a model folder stands for all in it):
        what no save or export of the app may replace."""
        if self.kind == "file":
            from app.core.model_sources import model_reads

            return model_reads(self.model, self.tokenizer or None)
        if self.kind == "checkpoint":
            return [Path(self.checkpoint)] if self.checkpoint else []
        if self.kind == "demo":
            from scratchformer import demo_checkpoint_path

            return [Path(str(demo_checkpoint_path()))]
        return []


@dataclass
class TraceRequest:
    """Everything the new-trace dialog asks for."""

    prompt: str
    source: ModelSource = field(default_factory=ModelSource)
    capture: str = DEFAULT_CAPTURE
    training: bool = False  # a training step: forward, next-token loss, backward
    edits: tuple = ()  # tracing.edits.Edit objects applied while tracing (app.core.edit_session)


def next_token_loss(output: Any, targets: Any) -> Any:
    """Cross-entropy of the logits (the output, or its first element) against the next
    tokens: what a training step of a language model on the prompt computes."""
    import torch.nn.functional as F

    logits = output if not isinstance(output, (tuple, list)) else output[0]
    logits = getattr(logits, "logits", logits)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


# --------------------------------------------------------------------------- models


def build_model(source: ModelSource) -> tuple[torch.nn.Module, Any]:
    """Return ``(model, tokenizer)`` for a source; raise SessionError naming the problem."""
    import torch

    import scratchformer

    tokenizer = scratchformer.ByteTokenizer()
    if source.kind == "demo":
        try:
            model = scratchformer.demo_model()
        except scratchformer.CheckpointError as e:
            raise SessionError(f"Cannot load the bundled demo model: {e}") from e
    elif source.kind == "preset":
        try:
            config = scratchformer.ModelConfig.preset(source.preset)
        except (KeyError, ValueError) as e:
            raise SessionError(f"Unknown preset {source.preset!r}: {e}") from e
        torch.manual_seed(source.seed)
        model = scratchformer.DecoderOnlyTransformer(config)
    elif source.kind == "checkpoint":
        path = Path(source.checkpoint)
        if not source.checkpoint or not path.is_file():
            raise SessionError(f"Checkpoint file not found: {source.checkpoint or '(none)'}")
        try:
            model = scratchformer.load_checkpoint(path)
        except scratchformer.CheckpointError as e:
            raise SessionError(f"Cannot load checkpoint {path.name}: {e}") from e
        except Exception as e:  # a foreign file may fail anywhere inside the loader
            raise SessionError(f"Cannot load checkpoint {path.name}: {e}") from e
    else:  # pragma: no cover - the dataclass restricts it
        raise SessionError(f"Unknown model source {source.kind!r}")
    if isinstance(model, tuple):  # tolerate loaders returning (model, extra)
        model = model[0]
    model.eval()
    return model, tokenizer


def context_length(model: Any) -> int | None:
    """The longest input the model accepts, read from its config; None when unknown."""
    config = getattr(model, "config", None)
    for name in ("max_seq_len", "context_length", "block_size", "n_positions", "max_len"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def encode_prompt(tokenizer: Any, prompt: str, model: Any) -> torch.Tensor:
    """Token ids shaped ``(B=1, T)``; SessionError when empty or longer than the model takes."""
    import torch

    if not prompt:
        raise SessionError("The prompt is empty: type at least one character.")
    ids = tokenizer.encode(prompt)
    ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    if ids and isinstance(ids[0], list):  # already batched
        ids = ids[0]
    limit = context_length(model)
    if limit is not None and len(ids) > limit:
        raise SessionError(
            f"The prompt is {len(ids)} tokens long but this model accepts at most {limit} "
            f"(its context length). Shorten the prompt."
        )
    return torch.tensor([ids], dtype=torch.long)  # (B, T)


# --------------------------------------------------------------------------- tracing


def run_trace(
    request: TraceRequest,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
) -> TraceOutcome:
    """Build the model, encode the prompt and trace one forward pass.

    Progress is counted by a global forward pre-hook of our own (module calls so far out of
    the modules in the model); the same hook raises :class:`Cancelled` once ``cancel`` is
    set, which stops the forward at the next module boundary. The hook is removed in
    ``finally`` whatever happens.
    """
    import torch

    import tracing

    if request.capture not in tracing.CAPTURE_LEVELS:
        raise SessionError(
            f"Unknown capture level {request.capture!r}; choose one of "
            + ", ".join(tracing.CAPTURE_LEVELS)
        )
    rebuild = None
    if request.source.kind == "file":
        model, args, kwargs, meta, rebuild = load_user_model(request)
    elif request.source.kind == "live":  # the same object and inputs every time
        live = request.source.live
        model, args, kwargs = live.model, tuple(live.args), dict(live.kwargs)
        meta = {**live.meta, "model_source": request.source.describe()}
    else:
        model, tokenizer = build_model(request.source)
        ids = encode_prompt(tokenizer, request.prompt, model)  # (B, T)
        args, kwargs = (ids,), {}
        meta = {
            "text": request.prompt,
            "tokens": ids[0].tolist(),
            "model_source": request.source.describe(),
        }
    total = sum(1 for _ in model.modules())
    owned = {id(m) for m in model.modules()}
    calls = 0

    def pre_hook(module: torch.nn.Module, args: Any) -> None:
        nonlocal calls
        if id(module) not in owned:
            return
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        calls += 1
        if progress is not None:
            progress(min(calls, total), total)

    if request.training:  # next-token cross-entropy on the token ids (the first input)
        args, targets = _next_token_split(args)
        if "tokens" in meta:
            meta["tokens"] = meta["tokens"][:-1]
    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    try:
        if request.training:
            if request.edits:
                raise SessionError("Edits apply to a forward pass, not to a training step.")
            from tracing.runs.backward import record_step

            run, loss_of, loss_type = _training_plan(request, model, args, kwargs, targets, meta)
            trace = record_step(
                model,
                run,
                loss_of,
                loss_type=loss_type,  # recorded as the step `loss` (None: the model's own)
                loss_targets=targets,
                capture=request.capture,
                meta=meta,
            )
        else:
            edits = list(request.edits) or None
            trace = tracing.trace(
                model, *args, capture=request.capture, meta=meta, edits=edits,
                rebuild=rebuild, **kwargs,
            )  # fmt: skip
    except tracing.edits.EditError as e:
        raise SessionError(f"The edit cannot run: {e}") from e
    except tracing.TraceError as e:
        if caused_by(e, tracing.edits.EditError):
            raise SessionError(f"The edit cannot run: {e.__cause__ or e}") from e
        if caused_by(e, Cancelled):
            return TraceOutcome(e.trace, "cancelled", "Tracing was cancelled.")
        return TraceOutcome(e.trace, "failed", str(e))
    except Cancelled:
        return TraceOutcome(None, "cancelled", "Tracing was cancelled.")
    finally:
        handle.remove()
    # mult-adds and parameters per module (torchinfo, on meta where the model allows)
    from tracing.runs import compute

    compute.attach(trace, model, *args, **kwargs)
    if progress is not None:
        progress(total, total)
    return TraceOutcome(trace, "complete")


def _training_plan(request: TraceRequest, model: Any, args: tuple, kwargs: dict, targets: Any,
                   meta: dict) -> tuple[Any, Any, str | None]:  # fmt: skip
    """``(run, loss_of, loss_type)`` for a training step: for the user's own model, the
    loss ``scratchformer train --model`` uses (``app.core.own_training``: a ``loss(output,
    targets)`` in the model's file, else the model's own loss when its forward takes
    ``targets``, else next-token cross-entropy); for the others, next-token cross-entropy."""
    if request.source.kind != "file":
        return (
            lambda: model(*args, **kwargs),
            lambda output: next_token_loss(output, targets),
            "next_token_loss",
        )
    from app.core import own_training, user_model

    module = user_model.loaded_module(meta.get("model_file", ""))
    file_loss = getattr(module, "loss", None)
    file_loss = file_loss if callable(file_loss) and not isinstance(file_loss, type) else None
    how = own_training.plan(model, file_loss)
    meta["loss_from"] = how.describe

    def run():
        return how.call(model, args[0], targets) if not kwargs else model(*args, **kwargs)

    if how.loss is None:

        def own(output):
            loss = own_training.own_loss(output)
            if loss is None:
                raise own_training.LossShapeError(
                    "the model was given targets but returned no loss: expected "
                    "(logits, loss), .loss or ['loss']"
                )
            return loss

        return run, own, None
    loss = how.loss
    name = "loss" if file_loss is not None else "next_token_loss"
    return run, lambda output: loss(output, targets), name


def _next_token_split(args: tuple) -> tuple[tuple, Any]:
    """``(ids[:, :-1], *rest)`` and the targets ``ids[:, 1:]``, for a training step on the
    token ids the model takes first."""
    import torch

    ids = args[0] if args else None
    if (
        not isinstance(ids, torch.Tensor)
        or ids.dim() != 2
        or ids.dtype not in (torch.int64, torch.int32)
        or ids.shape[1] < 2
    ):
        raise SessionError(
            "A training step needs token ids shaped (B, T), T >= 2, as the model's first "
            "input: it predicts each next token of the prompt"
        )
    return (ids[:, :-1], *args[1:]), ids[:, 1:]


def load_user_model(request: TraceRequest) -> tuple[Any, tuple, dict, dict, Any]:
    """Import and build the user's ``FILE.py:NAME`` afresh (every re-trace re-imports it),
    with its inputs: ``input_shape`` if given, else the prompt, else ``example_inputs``;
    and how to build it again with one size moved (``None``: not a class with defaults).
    A failure is a SessionError whose text ends with the traceback, for the dialog."""
    from app.core import model_sources, user_model

    source = request.source
    try:
        shape = user_model.InputSpec.parse_shape(source.input_shape) if source.input_shape else None
        prompt = None if shape is not None or not request.prompt else request.prompt
        inputs = user_model.InputSpec(prompt=prompt, shape=shape, dtype=source.input_dtype)
        loaded = model_sources.load(
            source.model, inputs, device=source.device, tokenizer=source.tokenizer or None
        )
    except user_model.UserCodeError as e:
        details = f"\n\n{e.details}" if e.details else ""
        raise SessionError(f"{e}{details}") from e
    loaded.meta["model_source"] = source.describe()
    return loaded.model, loaded.args, loaded.kwargs, loaded.meta, loaded.rebuild


def demo_trace(capture: str = DEFAULT_CAPTURE) -> TraceOutcome:
    """Trace the bundled demo model on its default prompt (what ``scratchformer app`` shows)."""
    import scratchformer

    prompt = scratchformer.DEMO_PROMPT
    return run_trace(TraceRequest(prompt=prompt, source=ModelSource("demo"), capture=capture))


def open_trace(path: str | Path) -> Trace:
    """Read a trace file; any problem becomes one SessionError naming the file and the cause.

    The trace's values come wrapped in :class:`CheckedValues`, so a value that cannot be
    read later (the file changed on disk, a checksum failed) reads as missing and is
    reported through ``trace.values.on_error`` instead of raising inside a pane.
    """
    import tracing

    path = Path(path)
    try:
        trace = tracing.load(path)
    except tracing.TraceFileError as e:
        reason = str(e).removeprefix(f"{path}: ")
        if reason == "no such file":
            raise SessionError(f"No such file: {path}") from e
        raise SessionError(f"{path.name} is not a readable trace file: {reason}") from e
    trace.values = CheckedValues(trace.values)
    return trace


class CheckedValues(Mapping):
    """A loaded trace's values as the app reads them: a read that fails with
    ``TraceFileError`` is reported once per key to ``on_error(message)`` and then reads
    as missing (``KeyError``, so ``Trace.value`` gives None and panes show "no value")."""

    def __init__(self, inner: Mapping, on_error: Callable[[str], None] | None = None):
        self.inner = inner
        self.on_error = on_error
        self.failed: dict[str, str] = {}

    def __getitem__(self, key: str):
        from tracing.errors import TraceFileError

        try:
            return self.inner[key]
        except TraceFileError as e:
            if key not in self.failed:
                self.failed[key] = str(e)
                if self.on_error is not None:
                    self.on_error(str(e))
            raise KeyError(key) from None

    def __iter__(self):
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)

    def __contains__(self, key: object) -> bool:
        return key in self.inner

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


def caused_by(error: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``error`` is a ``kind``, or was raised while handling one (its cause chain)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


# --------------------------------------------------------------------------- stepping


def clamp_step(trace: Trace, index: int) -> int:
    return max(0, min(index, len(trace.steps) - 1))


def step_over(trace: Trace, index: int) -> int:
    """Skip the current module's internals: the step after ``step.end`` (ops: the next step)."""
    step = trace.steps[index]
    if step.kind == "module" and step.end is not None:
        return clamp_step(trace, max(step.end, index) + 1)
    return clamp_step(trace, index + 1)


def step_out(trace: Trace, index: int) -> int:
    """Leave the enclosing module: the step after its end (the last step at the top level)."""
    parent = trace.steps[index].parent
    if parent is None:
        return len(trace.steps) - 1
    end = trace.steps[parent].end
    if end is None:  # a module that never finished (the forward raised inside it)
        return len(trace.steps) - 1
    return clamp_step(trace, end + 1)


def step_has_nonfinite(trace: Trace, index: int) -> bool:
    """Whether a tensor this step produced holds NaN or Inf.

    Outputs only, so the run stops where the bad value appears rather than at every
    consumer. The condition is ``tracing.breakpoints.NonFinite``: a mask op's Inf
    (``masked_fill(mask, -inf)`` before the softmax) is how causal attention works and does
    not count; a NaN anywhere does.
    """
    step = trace.steps[index]
    return _NON_FINITE.on_exit(step, step_outputs(trace, step)) is not None


_NON_FINITE = NonFinite()


def next_nonfinite(trace: Trace, index: int) -> int | None:
    """The next step after ``index`` where it went non-finite: the op that made a NaN or
    an Inf (not the modules around it, nor the steps it passed through), or in the
    backward the node that produced the first non-finite gradient
    (``tracing.breakpoints.nonfinite_origin``, the one definition N, breaks and the
    report share)."""
    hit = nonfinite_origin(trace, index)
    return None if hit is None else hit.step


def failing_step(trace: Trace) -> int:
    """The step that raised (``trace.failure``; else the last one marked with an error),
    else the last."""
    if trace.failure is not None and 0 <= trace.failure.step < len(trace.steps):
        return trace.failure.step
    for step in reversed(trace.steps):
        if step.error is not None:
            return step.index
    return max(0, len(trace.steps) - 1)


def first_steps_by_module(trace: Trace) -> dict[str, int]:
    """Module path -> index of its first call (modules that never ran are absent)."""
    first: dict[str, int] = {}
    for step in trace.steps:
        if step.kind == "module" and step.module not in first:
            first[step.module] = step.index
    return first


def status_text(trace: Trace, index: int) -> str:
    """``step 37 / 412 · blocks.1.self_attn · matmul`` (1-based for people)."""
    step = trace.steps[index]
    text = f"{step_text(index)} / {len(trace.steps)} · {step.label}"
    if step.kind == "backward":  # ``∇ blocks.1.attn · MmBackward0 ← matmul``
        text = f"{step_text(index)} / {len(trace.steps)} · ∇ {step.label}"
        if step.forward is not None:
            text += f" ← {trace.steps[step.forward].op}"
    return text
