"""Trace file speed against file size: save vs plain safetensors, lazy open, first read.

    .venv/bin/python benchmarks/bench_trace_file.py                   # 10 MB, 100 MB, 1 GB
    .venv/bin/python benchmarks/bench_trace_file.py --sizes 10,100 --steps 20000

Synthetic traces (no model): a root module and one op step per kept tensor of 4 MB, so the
file grows with ``--sizes`` while the manifest stays small; then one trace with
``--steps`` tiny steps, where the manifest itself is large. Opening must stay well under
0.5 s in every case, because ``tracing.load`` reads the header only.

Figures measured before, quoted from the code they explain (rerun to check them):
``tracing/file/layout.py`` (``VALUE_CACHE_BYTES``): with a 256 MB cache a full load of a
471 MB trace took 104 ms, 89 ms with 4 MB (the memory let go reused while in the CPU's
cache, ~20%); ``tracing/file/lazy_values.py``: values on freshly mapped pages cost ~40% of
a full load before the spare-memory reuse.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

import tracing
from tracing.record import ModuleInfo, SourceLocation, Step, TensorRecord, TensorStats, Trace

CHUNK = 1 << 20  # float32 elements per tensor: 4 MB


def synthetic_trace(n_tensors: int, numel: int) -> Trace:
    """A root module call and ``n_tensors`` op steps, each keeping one (numel,) tensor."""
    src = SourceLocation("/bench/model.py", 10, "y = f(x)", "forward")
    stats = TensorStats(-1.0, 1.0, 0.0, 0.5, 0, 0)
    tensors, steps, values = [], [Step(0, "module", "", "Bench", None, (), (), depth=0)], {}
    for i in range(n_tensors):
        key = f"v{i}"
        values[key] = torch.full((numel,), float(i))
        tensors.append(TensorRecord(i, (numel,), "float32", "cpu", ("?",), stats, key, i + 1))
        inputs = (i - 1,) if i else ()
        steps.append(Step(i + 1, "op", "", "f", src, inputs, (i,), depth=1, parent=0))
    steps[0] = Step(0, "module", "", "Bench", None, (), (n_tensors - 1,), end=n_tensors)
    modules = {"": ModuleInfo("", "Bench", None)}
    return Trace(steps=steps, modules=modules, tensors=tensors, values=values, meta={})


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_one(label: str, trace: Trace, folder: Path, repeat: int) -> None:
    ours, plain = folder / "t.sft", folder / "p.safetensors"
    from tracing.file.saving import tensors_to_store

    prepared = tensors_to_store(trace, plain)
    nbytes = sum(t.numel() * t.element_size() for t in prepared.values())
    plain_s = median_time(lambda: save_file(prepared, str(plain)), repeat)
    save_s = median_time(lambda: tracing.save(trace, ours), repeat)
    open_s = median_time(lambda: tracing.load(ours), repeat)
    loaded = tracing.load(ours)
    first_key = next(iter(loaded.values))
    start = time.perf_counter()
    loaded.values[first_key]
    read_s = time.perf_counter() - start
    print(
        f"{label:<28} file {ours.stat().st_size / 1e6:9.1f} MB  save {save_s * 1e3:8.1f} ms "
        f"(plain {plain_s * 1e3:8.1f} ms, {plain_s / save_s:4.2f}x throughput)  "
        f"open {open_s * 1e3:6.1f} ms  first read {read_s * 1e3:6.1f} ms  "
        f"[{nbytes / 1e6:.0f} MB of tensors]"
    )
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,100,1000", help="file sizes in MB")
    parser.add_argument("--steps", type=int, default=20000, help="steps of the big-manifest case")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tmp", help="folder for the files (default: system temp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        folder = Path(tmp)
        for mb in (int(s) for s in args.sizes.split(",") if s):
            n = max(1, mb * 10**6 // (CHUNK * 4))
            bench_one(f"{n} tensors of 4 MB", synthetic_trace(n, CHUNK), folder, args.repeat)
        bench_one(
            f"{args.steps} steps of 64 B", synthetic_trace(args.steps, 16), folder, args.repeat
        )


if __name__ == "__main__":
    main()
