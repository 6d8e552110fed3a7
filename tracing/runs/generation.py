"""Trace a generation: one traced forward pass per new token, and the tokens chosen.

Autoregressive generation runs the model again and again, each time over the whole
sequence so far, and appends the token it picks. :func:`trace_generate` does the same loop
with the tracer around every pass, so a person can step *within* a pass (the ops of one
forward) and *across* passes (a token timeline), and watch the attention maps grow by one
row and one column per token.

Each pass sees the full current sequence (cropped to the model's ``block_size`` when the
model has a ``config.block_size``, as ``generate()`` does); there is no key-value cache,
so pass ``n`` holds the complete computation that chose token ``n``.

On disk a generation is a folder: one trace file per pass (``pass_000.trace``...) and an
``index.json`` with the prompt, the chosen tokens and the settings. No pickle. With
``out=FOLDER`` each pass is streamed into its file while it runs (``tracing.trace``'s
``out``: values go to the disk as they are produced, memory stays flat) and the index is
written last, so a folder without one is not a generation. A generation that fails (a pass
raises, or Ctrl-C) still leaves a valid folder: the passes done, the failing pass's
partial trace, and an index whose ``error`` says what happened.

>>> g = trace_generate(model, idx, 5, capture="stats")       # doctest: +SKIP
>>> g.tokens, len(g.passes)                                  # doctest: +SKIP
([17, 4, 99, 99, 3], 5)
>>> g.save("run.gen"); g2 = load_generation("run.gen")       # doctest: +SKIP
>>> g = trace_generate(model, idx, 5, capture="values", out="run.gen")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tracing.jsonable import to_jsonable

if TYPE_CHECKING:  # pragma: no cover
    import torch.nn as nn

    from tracing.record import Trace

INDEX_FILE = "index.json"
FORMAT = "scratchformer-generation"
FORMAT_VERSION = 1

# --------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class TimelineEntry:
    """One generated token: which pass chose it and how sure that pass was."""

    position: int  # index of the new token in the full sequence
    token: int
    pass_index: int
    prob: float | None  # probability the pass gave it (None when logits were not kept)
    context_length: int  # tokens the pass saw


@dataclass
class GenerationTrace:
    """Every traced pass of a generation and the tokens it produced (batch of one row).

    ``passes[n]`` is the trace of the forward that chose ``tokens[n]``; it saw
    ``prompt + tokens[:n]`` (cropped to ``block_size``).
    """

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    passes: list[Trace] = field(default_factory=list)
    probs: list[float | None] = field(default_factory=list)  # of each chosen token
    settings: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the generation stopped early; None when it finished
    failed: Trace | None = None  # the partial trace of the pass that raised, if it left one

    @property
    def complete(self) -> bool:
        return self.error is None

    @property
    def sequence(self) -> list[int]:
        """Prompt and generated tokens together."""
        return [*self.prompt, *self.tokens]

    def __len__(self) -> int:
        return len(self.passes)

    def timeline(self) -> list[TimelineEntry]:
        """One entry per generated token, in order (the app's token timeline)."""
        entries = []
        for n, token in enumerate(self.tokens):
            seen = len(self.prompt) + n
            block = self.settings.get("block_size")
            entries.append(
                TimelineEntry(
                    position=len(self.prompt) + n,
                    token=token,
                    pass_index=n,
                    prob=self.probs[n] if n < len(self.probs) else None,
                    context_length=min(seen, block) if block else seen,
                )
            )
        return entries

    def step_count(self) -> int:
        """Steps over all passes (for a slider that crosses passes)."""
        return sum(len(t.steps) for t in self.passes)

    def locate(self, global_step: int) -> tuple[int, int]:
        """``(pass index, step index within that pass)`` of a step counted over all passes."""
        if global_step < 0:
            raise IndexError(f"step index {global_step} is negative")
        rest = global_step
        for n, t in enumerate(self.passes):
            if rest < len(t.steps):
                return n, rest
            rest -= len(t.steps)
        raise IndexError(f"step index {global_step} is past the last of {self.step_count()} steps")

    def global_step(self, pass_index: int, step: int) -> int:
        """Inverse of :meth:`locate`."""
        return sum(len(t.steps) for t in self.passes[:pass_index]) + step

    def attention_maps(self, pass_index: int) -> dict[str, torch.Tensor]:
        """The attention maps of one pass, ``(B, H, T, T)`` with T growing by pass."""
        return self.passes[pass_index].attention_maps()

    # ---- files

    def save(self, folder: str | os.PathLike) -> Path:
        """Write the folder: ``pass_NNN.trace`` per pass, then ``index.json`` (written last,
        under a temporary name then renamed, so a folder without it is incomplete)."""
        folder = _fresh_folder(folder)
        for n, t in enumerate(self.passes):
            t.save(folder / pass_file(n))
        if self.failed is not None:
            self.failed.save(folder / pass_file(len(self.passes)))
        return write_index(folder, self)


def pass_file(n: int) -> str:
    """The name of pass ``n``'s trace file in a generation folder."""
    return f"pass_{n:03d}.trace"


def _fresh_folder(folder: str | os.PathLike) -> Path:
    """``folder``, created, without an index: a stale one would make the folder look
    complete while its passes are being (re)written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / INDEX_FILE).unlink(missing_ok=True)
    return folder


def write_index(folder: Path, generation: GenerationTrace) -> Path:
    """Write ``index.json`` for ``generation``, whose pass files are already in ``folder``
    (under a temporary name, then renamed: the folder is a generation once it exists)."""
    index = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "prompt": generation.prompt,
        "tokens": generation.tokens,
        "probs": generation.probs,
        "settings": to_jsonable(generation.settings),
        "passes": [pass_file(n) for n in range(len(generation.passes))],
    }
    if generation.error is not None:
        index["error"] = generation.error
        if generation.failed is not None:
            index["failed_pass"] = pass_file(len(generation.passes))
    tmp = folder / (INDEX_FILE + ".tmp")
    tmp.write_text(json.dumps(index, indent=2))
    tmp.replace(folder / INDEX_FILE)
    return folder


def load_generation(folder: str | os.PathLike) -> GenerationTrace:
    """Open a folder written by :meth:`GenerationTrace.save` (traces load lazily)."""
    from tracing.errors import TraceFileError
    from tracing.file.loading import load

    folder = Path(folder)
    index_path = folder / INDEX_FILE
    if not index_path.is_file():
        raise TraceFileError(f"{folder}: not a saved generation (no {INDEX_FILE})")
    try:
        index = json.loads(index_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceFileError(f"{index_path}: unreadable generation index ({e})") from e
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise TraceFileError(f"{index_path}: not a scratchformer generation index")
    if index.get("version") != FORMAT_VERSION:
        raise TraceFileError(
            f"{index_path}: generation format version {index.get('version')!r}, "
            f"this version reads {FORMAT_VERSION}"
        )
    passes, tokens = index.get("passes"), index.get("tokens")
    prompt, probs = index.get("prompt"), index.get("probs", [])
    error, failed_pass = index.get("error"), index.get("failed_pass")
    ok = (
        isinstance(passes, list)
        and all(_plain_name(p) for p in passes)
        and (error is None or isinstance(error, str))
        and (failed_pass is None or (error is not None and _plain_name(failed_pass)))
        and isinstance(tokens, list)
        and all(isinstance(t, int) for t in tokens)
        and isinstance(prompt, list)
        and all(isinstance(t, int) for t in prompt)
        and isinstance(probs, list)
        and len(passes) == len(tokens)
    )
    if not ok:
        raise TraceFileError(f"{index_path}: malformed generation index")
    traces = []
    for name in [*passes, *([failed_pass] if failed_pass else [])]:
        path = folder / name
        if not path.is_file():
            raise TraceFileError(f"{index_path}: pass file {name} is missing")
        traces.append(load(path))
    return GenerationTrace(
        prompt=prompt,
        tokens=tokens,
        passes=traces[: len(passes)],
        probs=probs,
        settings=dict(index.get("settings") or {}),
        error=error,
        failed=traces[len(passes)] if failed_pass else None,
    )


def _plain_name(name: Any) -> bool:
    """A file name inside the folder (no path: an index cannot point elsewhere)."""
    return isinstance(name, str) and name not in ("", ".", "..") and not {"/", "\\"} & set(name)


# --------------------------------------------------------------------------- tracing


def _logits_of(output: Any) -> torch.Tensor:
    """The ``(B, T, V)`` logits from a model's output: a tensor, ``(logits, ...)``, a dict
    or an object with ``.logits`` (Hugging Face)."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, Mapping) and isinstance(output.get("logits"), torch.Tensor):
        return output["logits"]
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise TypeError(f"cannot find logits in the model's output ({type(output).__name__})")


def trace_generate(
    model: nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    capture: str = "stats",
    block_size: int | None = None,
    decode: Callable[[list[int]], str] | None = None,
    stop_token: int | None = None,
    out: str | os.PathLike | None = None,
    stream: bool = True,
    **trace_kwargs: Any,
) -> GenerationTrace:
    """Generate ``max_new_tokens`` tokens after ``idx`` ``(1, T)``, tracing every pass.

    The choice of token follows ``generate()`` in ``scratchformer``: temperature 0 is
    argmax; otherwise logits / temperature, optionally cut to the ``top_k`` best, and one
    ``torch.multinomial`` draw with ``generator``. ``decode`` (token ids -> text, e.g. a
    tokenizer's ``decode``) fills each pass's ``meta["text"]``; generation stops after
    ``stop_token`` (as ``generate()`` does). ``trace_kwargs`` go to
    :class:`tracing.Tracer` (``dims``, ``meta``, ``value_cap``...). Like every trace, the
    passes run in eval mode (dropout off) unless ``train=True`` is passed.

    ``out``: write the generation to this folder (what :meth:`GenerationTrace.save`
    writes). Each pass is streamed into its file while it runs, so memory stays flat and
    ``passes[n].values`` reads from the file; ``index.json`` is written last.
    ``stream=False`` keeps the passes in memory and saves them at the end instead.

    If a pass raises, the exception goes on up (a :class:`tracing.TraceError` for the
    forward, ``KeyboardInterrupt`` for Ctrl-C) with the generation so far as its
    ``.generation``: the passes done, ``failed`` (the raising pass's partial trace) and
    ``error``; with ``out``, that is also what the folder then holds. Stopped any other
    way (``SystemExit``...), the folder is left without an index: not a generation.
    """
    from tracing.capture.tracer import Tracer

    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.size(0) != 1:
        shape = tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__
        raise ValueError(f"trace_generate takes one row of token ids shaped (1, T), got {shape}")
    if idx.size(1) == 0:
        raise ValueError("trace_generate needs a prompt of at least one token")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if block_size is None:
        block_size = getattr(getattr(model, "config", None), "block_size", None)
        if block_size is None:  # Hugging Face GPT-2 spells it n_positions
            block_size = getattr(getattr(model, "config", None), "n_positions", None)

    prompt = [int(t) for t in idx[0].tolist()]
    result = GenerationTrace(
        prompt=prompt,
        settings={
            "temperature": temperature,
            "top_k": top_k,
            "capture": capture,
            "block_size": block_size,
            "max_new_tokens": max_new_tokens,
            "stop_token": stop_token,
        },
    )
    folder = None if out is None else _fresh_folder(out)
    streamed = folder if stream else None  # passes go to their files as they run
    seq = idx
    extra_meta = dict(trace_kwargs.pop("meta", None) or {})
    for n in range(max_new_tokens):
        context = seq if block_size is None else seq[:, -block_size:]  # (1, T')
        ids = context[0].tolist()
        meta = {**extra_meta, "generation_pass": n, "tokens": ids}
        if decode is not None:
            meta["text"] = decode(ids)
        pass_out = None if streamed is None else streamed / pass_file(n)
        tracer = Tracer(model, capture=capture, meta=meta, out=pass_out, **trace_kwargs)
        try:
            with torch.no_grad(), tracer:
                output = model(context)
            last = _logits_of(output)[:, -1, :].detach().float()  # (1, V): next token's scores
            next_token, prob = _choose(last, temperature, top_k, generator)
        except (Exception, KeyboardInterrupt) as e:
            _stopped(result, e, tracer.trace, folder, stream)
            raise
        result.passes.append(tracer.trace)
        result.tokens.append(next_token)
        result.probs.append(prob)
        seq = torch.cat([seq, torch.tensor([[next_token]], dtype=seq.dtype)], dim=1)
        if next_token == stop_token:
            break
    if folder is not None:
        if stream:
            write_index(folder, result)
        else:
            result.save(folder)
    return result


def generate_ids(
    model: nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    stop_token: int | None = None,
    block_size: int | None = None,
) -> list[int]:
    """The tokens :func:`trace_generate` would choose, without tracing: for any model
    whose output holds logits (a tensor, ``(logits, ...)``, ``.logits``)."""
    seq, new = idx, []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            context = seq if block_size is None else seq[:, -block_size:]  # (1, T')
            last = _logits_of(model(context))[:, -1, :].float()  # (1, V)
            token, _prob = _choose(last.cpu(), temperature, top_k, generator)
            new.append(token)
            seq = torch.cat([seq, torch.tensor([[token]], dtype=seq.dtype, device=seq.device)], 1)
            if token == stop_token:
                break
    return new


def _stopped(
    result: GenerationTrace,
    error: BaseException,
    partial: Trace | None,
    folder: Path | None,
    streamed: bool,
) -> None:
    """Record why the generation stopped on ``result`` (and on ``error``, as
    ``.generation``) and, with a folder, leave it valid and saying so."""
    if partial is not None and not partial.complete:
        result.failed = partial  # the raising pass's trace, as far as it got
    result.error = (
        partial.error
        if result.failed is not None and partial.error
        else f"{type(error).__name__}: {error}".rstrip(": ")
    )
    with contextlib.suppress(AttributeError):  # some exception types take no attributes
        error.generation = result  # type: ignore[attr-defined]
    if folder is None:
        return
    if streamed:
        write_index(folder, result)
    else:
        result.save(folder)


def _choose(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator
) -> tuple[int, float]:
    """The next token from ``(1, V)`` logits, and the probability it had."""
    if temperature == 0:
        token = int(logits.argmax(dim=-1))
        return token, float(torch.softmax(logits, dim=-1)[0, token])
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # (1, V)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(probs[0, token])
