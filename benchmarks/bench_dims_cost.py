"""What naming axes costs a user: the first trace in a fresh process, and growth with steps.

    .venv/bin/python benchmarks/bench_dims_cost.py               # both parts, 3 rounds
    .venv/bin/python benchmarks/bench_dims_cost.py --rounds 5 --tokens 256

1. **First trace** (issue 31, item 6): every ``scratchformer trace`` is a fresh process,
   so the one-time costs (imports, the extra passes, their caches) are what a user pays.
   Each round starts a new interpreter that builds gpt2-small (ours, 124M parameters),
   runs its plain forward on ``--tokens`` tokens (after one warm-up forward, so torch's
   own first-call costs count for neither), then traces it once at ``shapes`` with one
   naming level (``proven``, ``inputs``, ``ops``, ``off``: a process each, so no level
   reuses another's passes). The figure is traced / plain, per level; the target is
   ``proven`` ≤ 1.25x. The processes keep Python's bytecode cache, as a user's install
   has it (``--no-bytecode``: each compiles the tracer's modules again, as this machine's
   ``PYTHONDONTWRITEBYTECODE`` would make them).
2. **Linear in the steps**: a loop of 5,000 and of 50,000 ops, each traced first in a fresh
   process (names included): the 50,000-op trace should cost ≤ 12x the 5,000-op one, and
   take under 3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

FIRST = textwrap.dedent(
    """
    import json, sys, time, torch
    import tracing
    from scratchformer import DecoderOnlyTransformer, ModelConfig
    torch.manual_seed(0)
    model = DecoderOnlyTransformer(ModelConfig.preset("gpt2-small")).eval()
    ids = torch.randint(0, 50257, (1, TOKENS))
    with torch.no_grad():
        model(ids)  # torch's own first-call costs, outside both figures
        t0 = time.perf_counter(); model(ids); plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    trace = tracing.trace(model, ids, capture="shapes", naming=LEVEL)
    traced = time.perf_counter() - t0
    naming = (trace.meta.get("dims_evidence") or {}).get("seconds", 0.0)
    print(json.dumps({"plain": plain, "traced": traced, "naming": naming}))
    """
)

LOOP = textwrap.dedent(
    """
    import json, time, torch
    from torch import nn
    import tracing

    class Loop(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.n, self.lin = n, nn.Linear(8, 8)

        def forward(self, x):
            h = self.lin(x)
            for _ in range(self.n // 2):
                h = h * 0.5 + 1.0
            return h

    model = Loop(OPS).eval()
    x = torch.randn(2, 16, 8)
    t0 = time.perf_counter()
    trace = tracing.trace(model, x, capture="shapes")
    print(json.dumps({"seconds": time.perf_counter() - t0, "steps": len(trace.steps),
                      "naming": trace.meta["dims_evidence"]["seconds"]}))
    """
)


def _env(bytecode: bool) -> dict:
    """The environment of each round's process. With ``bytecode``, Python keeps its compiled
    modules as an installed package has them (pip compiles them; a checkout writes them on
    its first import): a machine that sets ``PYTHONDONTWRITEBYTECODE`` (this one does)
    makes every process compile the tracer's modules again, about 70 ms of a first trace
    that no user pays twice."""
    env = dict(os.environ)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


BYTECODE = True


def _run(code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(BYTECODE)
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def first_trace(rounds: int, tokens: int) -> None:
    levels = ["proven", "inputs", "ops", "off"]
    _run(FIRST.replace("TOKENS", "16").replace("LEVEL", "'proven'"))  # bytecode written
    ratios: dict[str, list[float]] = {lv: [] for lv in levels}
    naming: dict[str, list[float]] = {lv: [] for lv in levels}
    plains = []
    for _ in range(rounds):
        for lv in levels:  # side by side: each round runs every level once, in turn
            code = FIRST.replace("TOKENS", str(tokens)).replace("LEVEL", repr(lv))
            row = _run(code)
            plains.append(row["plain"])
            ratios[lv].append(row["traced"] / row["plain"])
            naming[lv].append(row["naming"])
    print(f"gpt2-small, {tokens} tokens, first trace in a fresh process ({rounds} rounds)")
    print(f"  plain forward {1e3 * statistics.median(plains):.0f} ms (median)")
    for lv in levels:
        r, n = statistics.median(ratios[lv]), 1e3 * statistics.median(naming[lv])
        print(f"  naming={lv:<7} {r:.2f}x the plain forward   (naming {n:.0f} ms)")
    met = statistics.median(ratios["proven"]) <= 1.25
    print(f"  target: naming=proven ≤ 1.25x -> {'met' if met else 'NOT met'}")


def loops(rounds: int) -> None:
    rows = {}
    for ops in (5_000, 50_000):
        runs = [_run(LOOP.replace("OPS", str(ops))) for _ in range(rounds)]
        rows[ops] = statistics.median(r["seconds"] for r in runs)
        naming = statistics.median(r["naming"] for r in runs)
        print(f"loop of {ops:,} ops: {runs[0]['steps']:,} steps, first trace {rows[ops]:.2f} s "
              f"(naming {naming:.2f} s)")  # fmt: skip
    ratio = rows[50_000] / rows[5_000]
    ok = ratio <= 12 and rows[50_000] < 3
    verdict = "met" if ok else "NOT met"
    print(f"  50,000 / 5,000 = {ratio:.1f}x (target ≤ 12x, and under 3 s) -> {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--part", choices=("first", "loops", "both"), default="both")
    parser.add_argument(
        "--no-bytecode", action="store_true", help="every process compiles every module again"
    )
    args = parser.parse_args()
    global BYTECODE
    BYTECODE = not args.no_bytecode
    print(f"Python's bytecode cache: {'kept' if BYTECODE else 'off (every module compiled)'}")
    if args.part in ("first", "both"):
        first_trace(args.rounds, args.tokens)
    if args.part in ("loops", "both"):
        loops(args.rounds)


if __name__ == "__main__":
    main()
