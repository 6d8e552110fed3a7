"""What tracing a training step costs, and what watching a loop costs when it does not fire.

Used by ``scratchformer bench`` (its training section) and ``benchmarks/bench_training_step.py``.

- **Traced step**: one optimisation step (``zero_grad``, forward with targets, backward,
  AdamW ``step``) plain, then under :func:`tracing.trace_step` at each capture level, in
  turn every round (interleaved, each after an untimed ``gc.collect()``); the figure is the
  median over rounds of ``traced / plain`` of the same round. The same model and optimizer
  serve every run, so the weights move a little each time, as in training.
- **Watched loop**: the same plain step, with and without a :func:`tracing.watch`
  (``when="nonfinite"``, never firing) attached, interleaved the same way.
- **Peak memory** (:func:`report_memory`): the peak resident set of a process that takes
  one plain step (which allocates the optimizer's state) and then the measured step:
  plain, traced at ``stats``, at ``values`` kept in memory, or at ``values`` streamed to a
  file (``out=``). Each in a fresh child process, so no figure hides in another's memory.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

LEVELS = ("shapes", "stats", "values")
TARGETS = {"shapes": 1.2, "stats": 1.6, "values": 2.0, "watched": 1.15}


@dataclass
class StepFigures:
    plain_ms: float
    ratios: dict[str, float]  # level (and "watched") -> median traced / plain
    traced_ms: dict[str, float]
    steps: int = 0  # steps in the last traced step (forward + backward)
    backward_steps: int = 0


def round_medians(
    plain: list[float], ratios: dict[str, list[float]], traced: dict[str, list[float]]
) -> dict:
    """Medians of interleaved rounds (seconds): ``plain_ms``, ``ratios`` (traced / plain,
    per level) and ``traced_ms`` (per level), as keyword arguments of a figures class."""
    return {
        "plain_ms": statistics.median(plain) * 1e3,
        "ratios": {k: statistics.median(v) for k, v in ratios.items()},
        "traced_ms": {k: statistics.median(v) * 1e3 for k, v in traced.items()},
    }


def _plain_step(model, ids, targets, optimizer) -> None:
    optimizer.zero_grad(set_to_none=True)
    _, loss = model(ids, targets)
    loss.backward()
    optimizer.step()


def measure_training_step(
    model,
    ids,
    targets,
    levels=LEVELS,
    repeat: int = 5,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[str], None] | None = None,
) -> StepFigures:
    """Interleaved rounds of: a plain step, a watched plain step, a traced step per level."""
    import torch

    import tracing

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    plain: list[float] = []
    ratios: dict[str, list[float]] = {k: [] for k in (*levels, "watched")}
    traced: dict[str, list[float]] = {k: [] for k in ratios}
    steps = backward = 0

    def timed(fn) -> float:
        gc.collect()
        start = clock()
        fn()
        return clock() - start

    for round_ in range(warmup + repeat):
        p = timed(lambda: _plain_step(model, ids, targets, optimizer))
        runs: dict[str, float] = {}
        watcher = tracing.watch(model, optimizer, "nonfinite")
        try:
            runs["watched"] = timed(lambda: _plain_step(model, ids, targets, optimizer))
        finally:
            watcher.close()
        for lvl in levels:
            holder: list = []

            def traced_step(lvl=lvl, holder=holder):
                optimizer.zero_grad(set_to_none=True)
                holder.append(
                    tracing.trace_step(model, (ids, targets), None, optimizer, capture=lvl)
                )

            runs[lvl] = timed(traced_step)
            t = holder[0]
            steps, backward = len(t.steps), len(t.steps) - (t.backward_start or 0)
            del holder[:], t
        if progress is not None:
            progress(f"round {round_ + 1}/{warmup + repeat}")
        if round_ < warmup:
            continue
        plain.append(p)
        for name, seconds in runs.items():
            ratios[name].append(seconds / p)
            traced[name].append(seconds)
    return StepFigures(
        **round_medians(plain, ratios, traced),
        steps=steps,
        backward_steps=backward,
    )


def report(say: Callable[[str], None], model, ids, label: str, repeat: int, warmup: int, clock):
    """Measure and print the training-step figures with their targets."""
    import torch

    targets = torch.roll(ids, -1, dims=1)  # next-token targets (any labels do for timing)
    fig = measure_training_step(model, ids, targets, repeat=repeat, warmup=warmup, clock=clock)
    say()
    say(
        f"training step (AdamW) of the {label}: plain {fig.plain_ms:.1f} ms; a traced step "
        f"records {fig.steps} steps ({fig.backward_steps} backward)"
    )
    for name in (*LEVELS, "watched"):
        bound = TARGETS[name]
        verdict = "ok" if fig.ratios[name] <= bound else "MISSED"
        what = "watched loop (not firing)" if name == "watched" else f"trace_step {name}"
        say(
            f"  {what:<26} {fig.ratios[name]:6.2f}x  ({fig.traced_ms[name]:8.1f} ms)  "
            f"target <= {bound:g}x  {verdict}"
        )
    return fig


# --------------------------------------------------------------------------- peak memory

MEMORY_MODES = ("plain", "stats", "values", "streamed")


def memory_child(spec: dict) -> dict:
    """One measurement, in this (fresh) process: build the preset's model (random weights)
    and AdamW, take a plain step, then the step ``spec["mode"]`` says; report the peak
    resident set (:func:`peak_rss`) and what the traced step kept."""
    import torch

    import tracing
    from scratchformer import DecoderOnlyTransformer, ModelConfig

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    config = ModelConfig.preset(spec["preset"])
    model = DecoderOnlyTransformer(config).train()
    tokens = min(spec["tokens"], config.block_size)
    ids = torch.randint(0, config.vocab_size, (1, tokens))
    targets = torch.roll(ids, -1, dims=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    _plain_step(model, ids, targets, optimizer)  # the optimizer's state exists from here
    out: dict = {"params": sum(p.numel() for p in model.parameters())}
    mode = spec["mode"]
    start = time.perf_counter()
    if mode == "plain":
        _plain_step(model, ids, targets, optimizer)
    else:
        optimizer.zero_grad(set_to_none=True)
        level = "stats" if mode == "stats" else "values"
        file = spec["file"] if mode == "streamed" else None
        trace = tracing.trace_step(model, (ids, targets), None, optimizer, capture=level, out=file)
        out["values"] = len(trace.values)
        if file is not None:
            out["file_bytes"] = os.path.getsize(file)
    out["seconds"] = time.perf_counter() - start
    out["peak_rss"] = peak_rss()
    return out


def peak_rss() -> int:
    """This process's peak resident set, in bytes: ``VmHWM`` of ``/proc/self/status``
    where there is one. (Linux's ``ru_maxrss`` keeps the peak of the process before its
    ``exec``, a copy of the parent: a child of a large parent would report the parent's.)"""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:  # pragma: no cover - not Linux
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _run_child(spec: dict) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    code = (
        "import json, sys; from app.commands.bench_training import memory_child; "
        "print(json.dumps(memory_child(json.loads(sys.argv[1]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec)],
        capture_output=True, text=True, check=False, env=env,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"memory measurement {spec['mode']} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_step_memory(preset: str, tokens: int, threads: int, folder: str | None = None):
    """Peak RSS per mode (:data:`MEMORY_MODES`), each from its own child process."""
    figures = {}
    with tempfile.TemporaryDirectory(dir=folder, prefix="scratchformer-step-") as tmp:
        for mode in MEMORY_MODES:
            spec = {"preset": preset, "tokens": tokens, "threads": threads, "mode": mode}
            spec["file"] = os.path.join(tmp, "step.sft")
            figures[mode] = _run_child(spec)
    return figures


def report_memory(say: Callable[[str], None], preset: str, tokens: int, threads: int, folder=None):
    """Measure and print the peak memory of a traced training step against the plain one."""
    fig = measure_step_memory(preset, tokens, threads, folder)
    plain = fig["plain"]
    say()
    say(
        f"peak memory of a training step (AdamW) of the {preset} preset, {tokens} tokens "
        f"({plain['params'] / 1e6:.1f} M parameters; each in its own process): plain "
        f"{plain['peak_rss'] / 1e6:,.0f} MB"
    )
    for mode in MEMORY_MODES[1:]:
        f = fig[mode]
        what = {"stats": "trace_step stats", "values": "trace_step values (memory)"}.get(
            mode, "trace_step values, out=FILE"
        )
        say(memory_line(what, f, plain))
    return fig


def memory_line(what: str, figure: dict, plain: dict) -> str:
    """One measured peak against the plain run's: ratio, MB, the difference, and the
    file written where there is one (``figure`` and ``plain`` hold ``peak_rss`` in bytes,
    optionally ``file_bytes``)."""
    extra = (figure["peak_rss"] - plain["peak_rss"]) / 1e6
    line = (
        f"  {what:<29} {figure['peak_rss'] / plain['peak_rss']:5.2f}x  "
        f"({figure['peak_rss'] / 1e6:,.0f} MB = plain {extra:+,.0f} MB"
    )
    if "file_bytes" in figure:
        line += f"; file {figure['file_bytes'] / 1e6:,.0f} MB"
    return line + ")"
