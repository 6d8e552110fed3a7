"""Peak memory of a streamed ``values`` trace against the plain forward (issue 14).

    .venv/bin/python benchmarks/bench_stream_memory.py                 # both models, 1,024 tokens
    .venv/bin/python benchmarks/bench_stream_memory.py --models gpt2-small --tokens 256
    .venv/bin/python benchmarks/bench_stream_memory.py --in-memory     # also the unstreamed trace

Each figure comes from its own child process, so one measurement's memory cannot hide
in another's: the child builds the model (random weights), runs either the plain forward
or ``tracing.trace(model, ids, capture="values", value_cap=None, out=FILE)``, and reports
its peak resident set (``VmHWM``, see ``app.commands.bench_training.peak_rss``). Target: the
streamed trace's peak at most the plain forward's + 300 MB, whatever the trace size.

Models: the ``gpt2-small`` preset, and ``gpt2-medium``-sized (24 layers, 1,024 wide, 16
heads): both at 1,024 tokens write several GB, so the trace files go to ``--tmp`` and are
deleted after each run. Large: run it once, on a machine with the disk space.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.commands.bench_training import memory_line

TARGET_EXTRA_MB = 300

MODELS = {
    "gpt2-small": {},
    "24x1024": {"d_model": 1024, "n_layers": 24, "n_heads": 16, "d_ff": 4096},
}


def child(spec: dict) -> dict:
    """Run one measurement in this (fresh) process and return its figures."""
    import torch

    import tracing
    from app.commands.bench_training import peak_rss
    from scratchformer import DecoderOnlyTransformer, ModelConfig

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    config = ModelConfig.preset("gpt2-small")
    for key, value in MODELS[spec["model"]].items():
        setattr(config, key, value)
    config.block_size = max(config.block_size, spec["tokens"])
    model = DecoderOnlyTransformer(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, spec["tokens"]))
    out = {"params": sum(p.numel() for p in model.parameters())}
    start = time.perf_counter()
    with torch.no_grad():
        if spec["mode"] == "plain":
            model(ids)
        elif spec["mode"] == "streamed":
            trace = tracing.trace(model, ids, capture="values", value_cap=None, out=spec["file"])
            out["steps"] = len(trace.steps)
            out["values"] = len(trace.values)
            out["file_bytes"] = os.path.getsize(spec["file"])
        else:  # in memory, as before streaming
            trace = tracing.trace(model, ids, capture="values", value_cap=None)
            out["values"] = len(trace.values)
    out["seconds"] = time.perf_counter() - start
    out["peak_rss"] = peak_rss()
    return out


def measure(spec: dict) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"child failed ({spec}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--in-memory", action="store_true", help="also the unstreamed trace")
    parser.add_argument("--tmp", help="folder for the trace files (default: system temp)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    modes = ["plain", "streamed"] + (["memory"] if args.in_memory else [])
    for name in args.models.split(","):
        figures = {}
        with tempfile.TemporaryDirectory(dir=args.tmp, prefix="scratchformer-stream-") as tmp:
            for mode in modes:
                spec = {"model": name, "tokens": args.tokens, "threads": args.threads}
                spec |= {"mode": mode, "file": str(Path(tmp) / "trace.sft")}
                figures[mode] = measure(spec)
                Path(spec["file"]).unlink(missing_ok=True)
        plain = figures["plain"]
        print(
            f"{name} ({plain['params'] / 1e6:.0f} M parameters), {args.tokens} tokens, "
            f"{args.threads} threads: plain forward peak RSS {plain['peak_rss'] / 1e6:,.0f} MB "
            f"({plain['seconds']:.1f} s)"
        )
        for mode in modes[1:]:
            f = figures[mode]
            line = memory_line(mode, f, plain) + f"  {f['seconds']:.1f} s, {f['values']} values"
            if mode == "streamed":
                extra = (f["peak_rss"] - plain["peak_rss"]) / 1e6
                ok = "ok" if extra <= TARGET_EXTRA_MB else "MISSED"
                line += f"  target <= plain + {TARGET_EXTRA_MB} MB  {ok}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
