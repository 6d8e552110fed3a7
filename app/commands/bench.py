"""``scratchformer bench``: what tracing costs, measured side by side on this machine.

    scratchformer bench            # demo model and gpt2-small at 256 tokens (a few minutes)
    scratchformer bench --quick    # tiny sizes, few repeats (a smoke test)

Prints, with the target beside each figure:

- for the demo model and the gpt2-small preset at 256 tokens on the CPU, the median time of
  the traced forward divided by the plain forward, for each capture level, by the wall
  clock and by this process's CPU clock side by side (the CPU clock is steadier when other
  programs load the machine). Each round runs the plain forward and every level once, in
  turn (interleaved), so load from other processes hits all of them alike; the figure is
  the median over rounds of ``traced / plain`` of the same round;
- for a ``values`` trace of the large model: the bytes it keeps, save and load throughput
  against a plain ``safetensors`` write/read of the same tensors (also interleaved; the
  plain read is ``load_file`` and a copy of every tensor out of its memory map, the same
  one copy per byte that our reader makes), the time to open the file lazily, and the
  memory the trace holds against the bytes of the tensors it keeps;
- a training step (forward + backward + AdamW) of the large model traced at each level,
  and a loop watched by ``tracing.watch`` that does not fire, against the plain step
  (``app/commands/bench_training.py``); then (not with ``--quick``) the peak memory of
  the traced step, in memory and streamed to a file, against the plain step's, each in
  its own process;
- what naming axes from evidence adds to a ``shapes`` trace of each model
  (:func:`measure_naming`): the capture alone, the first trace of a model (its second pass
  at other input sizes) and a trace repeated the same way (names reused per model).

Benchmarks print; they never fail a build. See also ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.commands import bench_training
from app.commands.checks import THREADS, int_between
from app.commands.options import add_command

LEVELS = ("shapes", "stats", "values")

# targets: (figure, comparison, bound)
TARGETS = {
    ("large", "shapes"): 1.15,
    ("large", "stats"): 1.3,
    ("large", "values"): 1.5,
    ("demo", "shapes"): 2.0,
    ("demo", "stats"): 3.0,
    ("demo", "values"): 3.0,
}
SAVE_TARGET = 0.5  # our save throughput / plain safetensors, at least
LOAD_TARGET = 0.8  # reading every tensor of a trace / a plain safetensors read, at least
OPEN_TARGET_S = 0.5  # lazy open, at most
MEMORY_TARGET = 1.2  # memory held by a values trace / bytes of its tensors, at most


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(
        subparsers, "bench", "measure tracing overhead, trace file throughput and memory", __doc__
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes and few repeats")
    p.add_argument(
        "--repeat", type=int_between(1, 10_000), help="rounds per figure (default 7, quick 3)"
    )
    p.add_argument(
        "--tokens", type=int_between(1, 1 << 20), default=256, help="tokens for the large model"
    )
    p.add_argument("--threads", type=THREADS, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--tmp", metavar="DIR", help="folder for the trace files (default: system)")
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time forwards by wall clock (default) or by this process's CPU time, which "
        "is steadier when other programs load the machine",
    )
    from app.commands.options import add_model_option
    from app.commands.trace import add_input_arguments

    add_model_option(p)
    p.add_argument("--prompt", help="with --model: the text to trace it on")
    add_input_arguments(p)
    p.set_defaults(func=run)


# --------------------------------------------------------------------------- measuring


@dataclass
class Overhead:
    """Traced / plain forward time per capture level, and the last values trace."""

    plain_ms: float
    ratios: dict[str, float]
    traced_ms: dict[str, float]
    steps: int
    values_trace: Any = None
    other_ratios: dict[str, float] = field(default_factory=dict)  # by the other clock


def measure_overhead(
    model, ids, levels=LEVELS, repeat: int = 7, warmup: int = 2, clock=time.perf_counter
) -> Overhead:
    """Interleaved rounds: plain forward, then each capture level, every round.

    Every timed call starts from the same state: a full garbage collection runs before
    each one, untimed. (Collecting before the plain forward only would make the plain
    forward run with cold caches and the traced one warm: on the demo model that alone
    moved the ``shapes`` figure from 2.5x to 2.1x.)

    ``clock`` is wall time by default; ``time.process_time`` (CPU time of this process,
    all threads) is steadier on a machine other work is loading.
    """
    import torch

    import tracing

    plain: list[float] = []
    ratios: dict[str, list[float]] = {lvl: [] for lvl in levels}
    other_ratios: dict[str, list[float]] = {lvl: [] for lvl in levels}
    traced: dict[str, list[float]] = {lvl: [] for lvl in levels}
    steps = 0
    values_trace = None
    # the other clock, printed beside: CPU time of this process if timing by the wall
    cpu = time.perf_counter if clock is time.process_time else time.process_time
    with torch.no_grad():
        for round_ in range(warmup + repeat):
            values_trace = None  # free the previous round's copies before timing
            gc.collect()
            start, start_other = clock(), cpu()
            model(ids)
            p, p_other = clock() - start, cpu() - start_other
            for lvl in levels:
                gc.collect()
                start, start_other = clock(), cpu()
                t = tracing.trace(model, ids, capture=lvl)
                elapsed, elapsed_other = clock() - start, cpu() - start_other
                if round_ >= warmup:
                    ratios[lvl].append(elapsed / p)
                    other_ratios[lvl].append(elapsed_other / max(p_other, 1e-9))
                    traced[lvl].append(elapsed)
                steps = len(t.steps)
                if lvl == "values":
                    values_trace = t
                del t
            if round_ >= warmup:
                plain.append(p)
    return Overhead(
        **bench_training.round_medians(plain, ratios, traced),
        steps=steps,
        values_trace=values_trace,
        other_ratios={lvl: statistics.median(r) for lvl, r in other_ratios.items()},
    )


@dataclass
class NamingFigures:
    """What naming axes adds to a ``shapes`` trace, in ms (medians)."""

    capture_ms: float  # the trace less the naming
    first_ms: float  # naming on a model's first trace: the second pass and the walk
    pass_ms: float  # of which the second pass
    repeat_ms: float  # naming on a trace repeated the same way: names reused
    no_pass_ms: float  # naming with no extra pass (naming="ops")


def measure_naming(model, ids, repeat: int = 3) -> NamingFigures:
    """Time naming (``tracing.dims``' ``name_trace``) inside ``shapes`` traces: first (its
    memo and the passes' cache emptied), repeated, and with no extra pass; and the rest of
    the trace beside it."""
    import torch

    import tracing
    from tracing.capture import tracer
    from tracing.dims import passes as dims_passes
    from tracing.dims import prove

    spent: list[float] = []
    real = tracer.name_trace

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    def once(naming: str = "proven") -> tuple[float, float, float]:
        gc.collect()
        spent.clear()
        start = time.perf_counter()
        trace = tracing.trace(model, ids, capture="shapes", naming=naming)
        total = time.perf_counter() - start
        info = trace.meta.get("dims_evidence") or {}
        return sum(spent), total, info.get("pass_seconds") or 0.0

    first, passes, repeated, no_pass, capture = [], [], [], [], []
    tracer.name_trace = timed
    try:
        with torch.no_grad():
            for _ in range(repeat):
                prove._MEMO.pop(model, None)
                dims_passes._CACHE.pop(model, None)
                naming, total, seconds = once()
                first.append(naming)
                passes.append(seconds)
                naming, total, _ = once()  # the same again: the names reused
                repeated.append(naming)
                capture.append(total - naming)
                naming, _, _ = once("ops")
                no_pass.append(naming)
    finally:
        tracer.name_trace = real
        prove._MEMO.pop(model, None)
    ms = lambda xs: 1e3 * statistics.median(xs)  # noqa: E731
    return NamingFigures(ms(capture), ms(first), ms(passes), ms(repeated), ms(no_pass))


@dataclass
class FileFigures:
    tensors: int
    tensor_bytes: int
    file_bytes: int
    save_mb_s: float
    plain_save_mb_s: float
    load_mb_s: float
    plain_load_mb_s: float
    open_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    read_mb_s: float = 0.0  # reading every tensor once the trace is open (load_mb_s less open)
    plain_lazy_mb_s: float = 0.0  # load_file alone: a memory map, nothing read (not comparable)

    @property
    def save_ratio(self) -> float:
        return self.save_mb_s / self.plain_save_mb_s

    @property
    def load_ratio(self) -> float:
        return self.load_mb_s / self.plain_load_mb_s

    @property
    def read_ratio(self) -> float:
        return self.read_mb_s / self.plain_load_mb_s


def kept_tensors(trace) -> dict[str, Any]:
    """The values a trace keeps, each once."""
    return {key: trace.values[key] for key in trace.values}


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _flush_disk() -> None:
    """Write back dirty pages (untimed) so each timed write starts from the same state."""
    if hasattr(os, "sync"):
        os.sync()


def measure_file(trace, folder: Path, repeat: int = 3) -> FileFigures:
    """Save/load throughput of the trace file against plain safetensors, interleaved."""
    from safetensors.torch import load_file, save_file

    import tracing
    from tracing.file.saving import tensors_to_store

    ours, plain = folder / "bench.sft", folder / "plain.safetensors"
    # the same tensors, made ready for a plain write beforehand (contiguous, no shared memory)
    plain_tensors = tensors_to_store(trace, plain)
    nbytes = tensor_bytes(plain_tensors.values())
    save_t, plain_save_t, load_t, plain_load_t, open_t, lazy_t = [], [], [], [], [], []
    tracing.save(trace, ours)  # untimed: one-time imports (the graph's networkx) paid here

    def save_plain() -> None:
        start = time.perf_counter()
        save_file(plain_tensors, str(plain))
        plain_save_t.append(time.perf_counter() - start)

    def save_ours() -> None:
        start = time.perf_counter()
        tracing.save(trace, ours)
        save_t.append(time.perf_counter() - start)

    def load_plain() -> None:
        start = time.perf_counter()
        loaded = load_file(str(plain))  # memory-mapped: no byte is read yet
        lazy_t.append(time.perf_counter() - start)
        for t in loaded.values():  # every byte copied into the process's own memory,
            t.clone()  # as our reader returns it: one copy out of the page cache each
        plain_load_t.append(time.perf_counter() - start)
        del loaded

    def load_ours() -> None:
        start = time.perf_counter()
        t = tracing.load(ours)
        open_t.append(time.perf_counter() - start)
        for key in t.values:  # read every tensor, as a full load does
            t.values[key]
        load_t.append(time.perf_counter() - start)
        t.values.close()

    for round_ in range(repeat):
        for path in (ours, plain):
            path.unlink(missing_ok=True)
        # Alternate who goes first, and flush dirty pages before each write: otherwise the
        # second writer of a round is throttled by the kernel writing back the first's.
        saves, loads = [save_plain, save_ours], [load_plain, load_ours]
        if round_ % 2:
            saves.reverse()
            loads.reverse()
        for step in saves + loads:
            gc.collect()
            _flush_disk()
            step()
    mb = nbytes / 1e6
    return FileFigures(
        tensors=len(plain_tensors),
        tensor_bytes=nbytes,
        file_bytes=ours.stat().st_size,
        save_mb_s=mb / statistics.median(save_t),
        plain_save_mb_s=mb / statistics.median(plain_save_t),
        load_mb_s=mb / statistics.median(load_t),
        read_mb_s=mb / max(statistics.median(b - a for a, b in zip(open_t, load_t)), 1e-9),
        plain_load_mb_s=mb / statistics.median(plain_load_t),
        plain_lazy_mb_s=mb / max(statistics.median(lazy_t), 1e-9),
        open_s=statistics.median(open_t),
    )


@dataclass
class MemoryFigures:
    tensor_bytes: int  # bytes of the tensors the trace keeps
    storage_bytes: int  # bytes of the distinct storages they hold alive
    python_bytes: int  # Python objects of the trace: records, steps, dicts, tensor objects

    @property
    def held(self) -> int:
        return self.storage_bytes + self.python_bytes

    @property
    def ratio(self) -> float:
        return self.held / max(self.tensor_bytes, 1)


def measure_memory(model, ids) -> MemoryFigures:
    """Trace at ``values`` and compare what it holds with the bytes of the kept tensors.

    What a trace holds is (1) every distinct storage its kept tensors keep alive — a small
    view of a big buffer keeps the whole buffer, which is the usual way such a trace grows
    past its tensors — and (2) its Python objects (records, steps, dicts), which
    ``tracemalloc`` sees (tensor data is allocated outside Python's allocator, so it is
    not counted twice). Process RSS is not used: the allocator keeps the forward's freed
    temporaries, which would hide or inflate the figure.
    """
    import tracemalloc

    import torch

    import tracing

    with torch.no_grad():
        model(ids)  # warm: lazily built state exists before measuring
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        trace = tracing.trace(model, ids, capture="values")
        gc.collect()
        python_bytes = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    values = list(kept_tensors(trace).values())
    storages: dict[int, int] = {}
    for v in values:
        s = v.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    figures = MemoryFigures(tensor_bytes(values), sum(storages.values()), max(python_bytes, 0))
    del trace
    return figures


# --------------------------------------------------------------------------- printing


def _verdict(value: float, bound: float, at_most: bool) -> str:
    ok = value <= bound if at_most else value >= bound
    return "ok" if ok else "MISSED"


def _target_text(value: float, bound: float, at_most: bool, unit: str = "x") -> str:
    sign = "<=" if at_most else ">="
    return f"target {sign} {bound:g}{unit}  {_verdict(value, bound, at_most)}"


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _models(quick: bool, tokens: int):
    """(label, key, model, ids) for the small and the large benchmark model."""
    import torch

    from scratchformer import (
        DEMO_PROMPT,
        ByteTokenizer,
        DecoderOnlyTransformer,
        ModelConfig,
        demo_model,
    )

    try:
        demo, demo_label = demo_model(), "demo model (bundled checkpoint)"
    except Exception:  # no bundled checkpoint yet: same shapes, random weights
        torch.manual_seed(0)
        demo = DecoderOnlyTransformer(ModelConfig.preset("demo")).eval()
        demo_label = "demo preset (random weights)"
    demo_ids = torch.tensor([ByteTokenizer().encode(DEMO_PROMPT)])  # (B, T)

    name = "nano" if quick else "gpt2-small"
    tokens = 32 if quick else tokens
    torch.manual_seed(0)
    config = ModelConfig.preset(name)
    large = DecoderOnlyTransformer(config).eval()
    tokens = min(tokens, config.block_size)
    large_ids = torch.randint(
        0, config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0)
    )
    return [
        (f"{demo_label}, {demo_ids.shape[1]} tokens", "demo", demo, demo_ids),
        (f"{name} preset (random weights), {tokens} tokens", "large", large, large_ids),
    ]


def _bench_model(args: argparse.Namespace, say, repeat: int, warmup: int) -> int:
    """``--model``: the capture overhead and the naming cost on the user's own model and
    inputs (no targets: they are set for our presets)."""
    from app.cli import UserError
    from app.commands.trace import load_user_model

    loaded = load_user_model(args)
    if len(loaded.args) != 1 or loaded.kwargs:
        raise UserError("bench --model times a model called with one input tensor")
    model, ids = loaded.model, loaded.args[0]
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    fig = measure_overhead(model, ids, repeat=repeat, warmup=warmup, clock=clock)
    say()
    say(f"{args.model}: plain forward {fig.plain_ms:.1f} ms, {fig.steps} steps traced")
    other = "cpu" if args.clock == "wall" else "wall"
    for lvl in LEVELS:
        say(
            f"  {lvl:<7} {fig.ratios[lvl]:6.2f}x  ({fig.traced_ms[lvl]:8.1f} ms; "
            f"{other} clock {fig.other_ratios[lvl]:5.2f}x)"
        )
    nf = measure_naming(model, ids, repeat=1 if args.quick else min(repeat, 3))
    say(
        f"  naming  capture {nf.capture_ms:7.1f}  first +{nf.first_ms:6.1f} "
        f"(pass {nf.pass_ms:6.1f})  repeat +{nf.repeat_ms:5.1f}  no pass +{nf.no_pass_ms:6.1f}"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    """The bench, with what is alive before it (torch, the app's modules) frozen out of
    the garbage collector: the untimed full collections between rounds then scan only what
    the rounds made (seconds fewer of them in all, the figures the same)."""
    gc.collect()
    gc.freeze()
    try:
        return _run(args)
    finally:
        gc.unfreeze()


def _run(args: argparse.Namespace) -> int:
    import torch

    from app.cli import UserError

    repeat = args.repeat or (3 if args.quick else 7)
    warmup = 1 if args.quick else 2
    if args.tmp is not None and not os.path.isdir(args.tmp):
        raise UserError(f"--tmp {args.tmp}: no such folder")
    if args.tmp is not None:  # a scratch folder is made in it: never inside a model folder
        from app.commands.checks import not_an_input
        from app.commands.options import model_inputs

        not_an_input(args.tmp, inputs=model_inputs(args) if args.model else ())
    if args.threads:
        torch.set_num_threads(args.threads)
    out = sys.stdout

    def say(line: str = "") -> None:
        out.write(line + "\n")
        out.flush()

    say(
        f"scratchformer bench{' --quick' if args.quick else ''}: torch {torch.__version__}, "
        f"CPU, {torch.get_num_threads()} threads, {repeat} interleaved rounds, "
        f"{args.clock} clock"
    )
    if args.model:
        return _bench_model(args, say, repeat, warmup)
    models = _models(args.quick, args.tokens)
    large_trace = None
    large_model = large_ids = None
    for label, key, model, ids in models:
        clock = time.perf_counter if args.clock == "wall" else time.process_time
        fig = measure_overhead(model, ids, repeat=repeat, warmup=warmup, clock=clock)
        say()
        say(f"{label}: plain forward {fig.plain_ms:.1f} ms, {fig.steps} steps traced")
        other = "cpu" if args.clock == "wall" else "wall"
        for lvl in LEVELS:
            bound = TARGETS.get((key, lvl))
            target = _target_text(fig.ratios[lvl], bound, True) if bound else ""
            say(
                f"  {lvl:<7} {fig.ratios[lvl]:6.2f}x  ({fig.traced_ms[lvl]:8.1f} ms; "
                f"{other} clock {fig.other_ratios[lvl]:5.2f}x)  {target}"
            )
        if key == "large":
            large_trace, large_model, large_ids = fig.values_trace, model, ids
        del fig

    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="scratchformer-bench-") as tmp:
        files = measure_file(large_trace, Path(tmp), repeat=min(repeat, 3))
    say()
    say(
        f"values trace of the {models[1][0].split(' ')[0]} model: {files.tensors} tensors kept, "
        f"{_mb(files.tensor_bytes)} of tensors, file {_mb(files.file_bytes)}"
    )
    say(
        f"  save   {files.save_mb_s:8,.0f} MB/s vs plain safetensors {files.plain_save_mb_s:,.0f} "
        f"MB/s = {files.save_ratio:.2f}x  {_target_text(files.save_ratio, SAVE_TARGET, False)}"
    )
    say(
        f"  load   {files.read_mb_s:8,.0f} MB/s vs plain safetensors {files.plain_load_mb_s:,.0f} "
        f"MB/s = {files.read_ratio:.2f}x  {_target_text(files.read_ratio, LOAD_TARGET, False)} "
        f"(every tensor, once open; with the open: {files.load_ratio:.2f}x)"
    )
    say(
        "         (plain: load_file, then every tensor copied out of its memory map, the one "
        "copy our reader makes too; load_file alone reads nothing: "
        f"{files.plain_lazy_mb_s:,.0f} MB/s)"
    )
    say(
        f"  open   {files.open_s * 1e3:8.1f} ms (lazy: header only)  "
        f"{_target_text(files.open_s, OPEN_TARGET_S, True, ' s')}"
    )
    del large_trace
    gc.collect()
    mem = measure_memory(large_model, large_ids)
    say(
        f"  memory {mem.ratio:8.2f}x the bytes of its tensors ({_mb(mem.held)} held: "
        f"{_mb(mem.storage_bytes)} storages + {_mb(mem.python_bytes)} Python objects, for "
        f"{_mb(mem.tensor_bytes)} of tensors)  {_target_text(mem.ratio, MEMORY_TARGET, True)}"
    )

    say()
    say("naming axes from evidence, added to a shapes trace (ms, median):")
    for label, _, model, ids in models:
        nf = measure_naming(model, ids, repeat=1 if args.quick else min(repeat, 3))
        say(
            f"  naming {label.split(',')[0][:34]:<34} capture {nf.capture_ms:7.1f}  "
            f"first +{nf.first_ms:6.1f} (pass {nf.pass_ms:6.1f})  "
            f"repeat +{nf.repeat_ms:5.1f}  no pass +{nf.no_pass_ms:6.1f}"
        )

    clock = time.perf_counter if args.clock == "wall" else time.process_time
    label = models[1][0].split(",")[0]  # "gpt2-small preset (random weights)"
    bench_training.report(say, large_model, large_ids, label, min(repeat, 5), warmup, clock)
    del large_model
    gc.collect()
    if args.quick:  # four fresh processes: not for a quick look
        say("  (peak memory of a training step: not with --quick)")
        return 0
    preset = label.split(" ")[0]
    threads = torch.get_num_threads()
    bench_training.report_memory(say, preset, large_ids.shape[1], threads, args.tmp)
    return 0
