"""What tracing a training step costs, and what watching a loop costs when it does not fire.

Used by ``scratchformer bench`` (its training section) and ``benchmarks/bench_training_step.py``.

- **Traced step**: one optimisation step (``zero_grad``, forward with targets, backward,
  AdamW ``step``) plain, then under :func:`tracing.trace_step` at each capture level, in
  turn every round (interleaved, each after an untimed ``gc.collect()``); the figure is the
  median over rounds of ``traced / plain`` of the same round. The same model and optimizer
  serve every run, so the weights move a little each time, as in training.
- **Watched loop**: the same plain step, with and without a :func:`tracing.watch`
  (``when="nonfinite"``, never firing) attached, interleaved the same way.
"""

from __future__ import annotations

import gc
import statistics
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
