"""Is a streamed trace's write as fast as ``Trace.save``? (issue 14: "keep the save as fast")

    PYTHONPATH=$PWD python benchmarks/bench_stream_save.py [--tokens 128] [--rounds 3]

The same ``values`` trace (``value_cap=None``) of the ``gpt2-small`` preset (random
weights) is written two ways, alternating round by round so load noise hits both:

- **saved**: traced in memory, then ``Trace.save(path)``: the time of the save;
- **streamed**: ``tracing.trace(..., out=path)``: the time spent inside the file writer
  (``TraceWriter.add`` for every value as it comes, ``TraceWriter.close`` for the
  manifest and header), measured by wrapping those two methods;
- **streamed, no journal**: the same capture with its checkpoints turned off
  (``tracing.file.journal``), so the journal's share of the capture shows.

Printed: medians of wall and CPU time, and the ratio streamed / saved (target <= 1.0:
the streamed write costs no more than the save it replaces). Also the whole capture
both ways (trace + save against trace streamed) and the file sizes. Files go to a
temporary folder (``--tmp``) and are deleted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import tracing
from tracing import file as trace_file
from tracing.file import journal


class WriterClock:
    """Wall and CPU seconds spent inside ``TraceWriter.add`` and ``TraceWriter.close``."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def __enter__(self) -> WriterClock:
        self._saved = {name: getattr(trace_file.TraceWriter, name) for name in ("add", "close")}
        for name, method in self._saved.items():
            setattr(trace_file.TraceWriter, name, self._timed(method))
        return self

    def __exit__(self, *exc) -> None:
        for name, method in self._saved.items():
            setattr(trace_file.TraceWriter, name, method)

    def _timed(self, method):
        def timed(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return method(*args, **kwargs)
            finally:
                self.wall += time.perf_counter() - t0
                self.cpu += time.process_time() - c0

        return timed


def one_round(model, ids, folder: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    saved, streamed = folder / "saved.sft", folder / "streamed.sft"
    t0 = time.perf_counter()
    with torch.no_grad():
        trace = tracing.trace(model, ids, capture="values", value_cap=None)
    t1, c1 = time.perf_counter(), time.process_time()
    trace.save(saved)
    out["save_wall"], out["save_cpu"] = time.perf_counter() - t1, time.process_time() - c1
    out["memory_total"] = time.perf_counter() - t0
    out["saved_bytes"] = saved.stat().st_size
    del trace
    saved.unlink()
    with WriterClock() as clock:
        t0 = time.perf_counter()
        with torch.no_grad():
            trace = tracing.trace(model, ids, capture="values", value_cap=None, out=streamed)
        out["streamed_total"] = time.perf_counter() - t0
    out["stream_wall"], out["stream_cpu"] = clock.wall, clock.cpu
    out["streamed_bytes"] = streamed.stat().st_size
    trace.values.close()
    del trace
    streamed.unlink()
    # the same streamed capture without its journal (tracing.file.journal): what the
    # checkpoints cost
    saved_seconds = journal.JOURNAL_SECONDS
    journal.JOURNAL_SECONDS = 1e12
    try:
        t0 = time.perf_counter()
        with torch.no_grad():
            trace = tracing.trace(model, ids, capture="values", value_cap=None, out=streamed)
        out["unjournaled_total"] = time.perf_counter() - t0
    finally:
        journal.JOURNAL_SECONDS = saved_seconds
    trace.values.close()
    del trace
    streamed.unlink()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tmp", help="folder for the trace files (default: system temp)")
    args = parser.parse_args()
    from scratchformer import DecoderOnlyTransformer, ModelConfig

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = ModelConfig.preset("gpt2-small")
    config.block_size = max(config.block_size, args.tokens)
    model = DecoderOnlyTransformer(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, args.tokens))
    rounds = []
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="scratchformer-save-") as tmp:
        one_round(model, ids, Path(tmp))  # warm-up: first-touch costs, page cache
        for _ in range(args.rounds):
            rounds.append(one_round(model, ids, Path(tmp)))

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    size = med("saved_bytes") / 1e6
    print(f"gpt2-small @{args.tokens} tokens, capture values, value_cap None, {args.threads} "
          f"thread(s), {args.rounds} interleaved rounds (medians); file {size:,.0f} MB saved, "
          f"{med('streamed_bytes') / 1e6:,.0f} MB streamed")  # fmt: skip
    for clock in ("wall", "cpu"):
        save, stream = med(f"save_{clock}"), med(f"stream_{clock}")
        ok = "ok" if stream <= save else "SLOWER"
        print(f"  write {clock:<4}: Trace.save {save * 1e3:8.1f} ms ({size / save:6.0f} MB/s)   "
              f"streamed writer {stream * 1e3:8.1f} ms   ratio streamed/saved "
              f"{stream / save:5.2f}  target <= 1.00  {ok}")  # fmt: skip
    memory, streamed = med("memory_total"), med("streamed_total")
    print(f"  whole capture: trace + save {memory:.2f} s, traced streamed {streamed:.2f} s "
          f"(ratio {streamed / memory:.2f})")  # fmt: skip
    journaled, plain = med("streamed_total"), med("unjournaled_total")
    print(f"  journal: streamed with checkpoints {journaled:.2f} s, without {plain:.2f} s "
          f"(ratio {journaled / plain:.3f}; at most one per {journal.JOURNAL_SECONDS:g} s "
          f"and {journal.JOURNAL_COST_RATIO}x its cost)")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
