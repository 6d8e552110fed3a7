"""How low can a trace of the demo model go? The instruments alone, against the tracer.

    .venv/bin/python benchmarks/bench_floor.py              # demo model, 150 rounds
    .venv/bin/python benchmarks/bench_floor.py --rounds 300 --threads 1

Four ways to run the same forward pass, interleaved round by round, each timed call after
an untimed full garbage collection (the protocol of ``scratchformer bench``):

- ``plain``: the model alone;
- ``mode only``: inside a ``TorchFunctionMode`` that only calls through (what intercepting
  every torch call costs, before any bookkeeping);
- ``log only``: that mode plus a wrapper on every module's ``forward``, and each event
  appended to a list as a raw tuple (tensors, versions, source line): the least an
  instrument built on these two mechanisms can do, with nothing resolved afterwards;
- ``tracing.trace``: the real tracer at ``shapes``.

The figure is each median divided by the plain median. It bounds what any tracer of this
design can reach on a model whose forward is a few milliseconds of small ops.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch
from torch.overrides import TorchFunctionMode

import tracing
from tracing import capture
from tracing.capture.source import caller_location


class _CallThrough(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **kwargs) if kwargs else func(*args)


class _LogOnly(TorchFunctionMode):
    """Appends (name, input tensors, their versions, result, source) for every call."""

    def __init__(self, log: list):
        super().__init__()
        self.log = log

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = capture._classify(func)
        if name is capture._SKIP:
            return func(*args, **kwargs) if kwargs else func(*args)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        versions = [t._version for t in tensors]
        result = func(*args, **kwargs) if kwargs else func(*args)
        self.log.append((name, tensors, versions, result, caller_location(1)))
        return result


def _log_only(model: torch.nn.Module, ids: torch.Tensor) -> list:
    log: list = []
    disable = torch._C.DisableTorchFunction
    wrapped = []
    for path, module in model.named_modules():
        inner = module.forward

        def forward(*args, _inner=inner, _path=path, **kwargs):
            with disable():
                log.append(("enter", _path, args, kwargs, caller_location(1)))
            output = _inner(*args, **kwargs)
            with disable():
                log.append(("exit", _path, output))
            return output

        module.__dict__["forward"] = forward
        wrapped.append(module)
    try:
        with _LogOnly(log):
            model(ids)
    finally:
        for module in wrapped:
            del module.__dict__["forward"]
    return log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from scratchformer import DEMO_PROMPT, ByteTokenizer, demo_model

    model = demo_model().eval()
    ids = torch.tensor([ByteTokenizer().encode(DEMO_PROMPT)])
    runs = {
        "plain": lambda: model(ids),
        "mode only": lambda: _run_in(_CallThrough(), model, ids),
        "log only": lambda: _log_only(model, ids),
        "tracing.trace": lambda: tracing.trace(model, ids, capture="shapes"),
    }
    print(
        f"demo model, {ids.shape[1]} tokens, {torch.get_num_threads()} threads, "
        f"{args.rounds} rounds (median; each after gc.collect())"
    )
    print_medians(interleaved_medians(runs, args.rounds))


def interleaved_medians(
    runs: dict, rounds: int, warmup: int = 3, clock=time.perf_counter
) -> dict[str, float]:
    """Median seconds of each callable, run in turn every round, each after an untimed
    ``gc.collect()`` (the protocol of ``scratchformer bench``), without autograd.
    ``clock=time.process_time`` counts this process's CPU time only (a shared machine)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.no_grad():
        for round_ in range(warmup + rounds):
            for name, run in runs.items():
                gc.collect()
                start = clock()
                run()
                elapsed = clock() - start
                if round_ >= warmup:
                    times[name].append(elapsed)
    return {name: statistics.median(values) for name, values in times.items()}


def print_medians(medians: dict[str, float], baseline: str = "plain") -> None:
    """One line per run: its median and its ratio to the baseline's."""
    for name, median in medians.items():
        print(f"  {name:14s} {median * 1e3:6.2f} ms  {median / medians[baseline]:5.2f}x")


def _run_in(mode: TorchFunctionMode, model: torch.nn.Module, ids: torch.Tensor) -> None:
    with mode:
        model(ids)


if __name__ == "__main__":
    main()
