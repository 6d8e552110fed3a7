"""The same names when two sizes coincide, on every causal-LM architecture (issue 22, item 4).

    .venv/bin/python benchmarks/bench_dims_coincidences.py               # every variant
    .venv/bin/python benchmarks/bench_dims_coincidences.py --variant "K == KV" mixtral

Each architecture is built at the survey's sizes (``bench_dims_architectures.py``: every
size distinct) and again with one size moved onto another's:

- ``T == D``: 16 tokens, the head width; ``B == T``: a batch of 11, the tokens;
- ``K == KV``: top-2 routing, the key/value heads' 2; ``E == H``: 6 experts, the heads;
- ``F == V``: a vocabulary of 200, the feed-forward width.

A name says what an axis is, not how big it is, so the two traces must name every tensor
the same, axis by axis. An axis whose name changes was named by its size. Traces whose
steps differ (routing that depends on the data, a loop over the tokens) are not compared
and are counted. Per variant it prints the models compared, those with an axis whose name
changed, and examples (``distinct -> coinciding``, the size it had in each).
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_dims_architectures as survey

import tracing

os.environ.setdefault("SCRATCHFORMER_DIMS_STRICT", "1")  # a fault in naming is counted

VARIANTS = {
    "T == D": {"T": 16},
    "B == T": {"B": 11},
    "K == KV": {"_MOE": {"num_experts_per_tok": 2, "moe_topk": 2}},
    "E == H": {"_MOE": {k: 6 for k in ("num_local_experts", "num_experts", "n_routed_experts")}},
    "F == V": {"_SET": {"vocab_size": 200}},
}


@contextlib.contextmanager
def sizes(change: dict):
    """The survey's module-level sizes, changed for one variant and put back after."""
    saved = {"B": survey.B, "T": survey.T}
    tables = {name: dict(getattr(survey, name)) for name in ("_SET", "_MOE")}
    try:
        for key, value in change.items():
            if isinstance(value, dict):
                getattr(survey, key).update(value)
            else:
                setattr(survey, key, value)
        yield
    finally:
        survey.B, survey.T = saved["B"], saved["T"]
        for name, table in tables.items():
            getattr(survey, name).clear()
            getattr(survey, name).update(table)


def names(model_type: str, change: dict | None = None):
    """(step keys, [(shape, dims)] per tensor) of one architecture's shapes trace."""
    with sizes(change or {}), survey._limit(120):
        model, ids = survey.build(model_type)
        trace = tracing.trace(model, ids, capture="shapes")
    keys = [(s.module, s.op, len(s.inputs), len(s.outputs)) for s in trace.steps]
    return keys, [(r.shape, r.dims or ("?",) * len(r.shape)) for r in trace.tensors]


def differences(a, b) -> collections.Counter | None:
    """Axes named differently in two traces of the same steps; ``None``: not the same."""
    (keys_a, tensors_a), (keys_b, tensors_b) = a, b
    if keys_a != keys_b or len(tensors_a) != len(tensors_b):
        return None
    out: collections.Counter = collections.Counter()
    for (shape_a, dims_a), (shape_b, dims_b) in zip(tensors_a, tensors_b):
        if len(shape_a) != len(shape_b):
            return None
        for x, y, sa, sb in zip(dims_a, dims_b, shape_a, shape_b):
            if x != y:
                out[f"{x}={sa} -> {y}={sb}"] += 1
    return out


def main() -> int:
    parser = survey.survey_arguments(__doc__, failing=False)
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS))
    args = parser.parse_args()
    survey.quiet(args.threads)
    models = args.models or survey.architectures()
    variants = args.variant or list(VARIANTS)
    started = time.perf_counter()
    base = {}
    for m in models:
        with contextlib.suppress(BaseException):
            base[m] = names(m)
    totals = {}
    for variant in variants:
        compared, unaligned, changed, axes = 0, 0, [], 0
        for m, distinct in base.items():
            try:
                same = names(m, VARIANTS[variant])
            except BaseException:
                continue
            diff = differences(distinct, same)
            if diff is None:
                unaligned += 1
                continue
            compared += 1
            if diff:
                changed.append(m)
                axes += sum(diff.values())
                top = ", ".join(f"{k} ×{n}" for k, n in diff.most_common(3))
                print(f"  {variant:<8} {m:<26} {top}", flush=True)
        totals[variant] = (compared, unaligned, len(changed), axes)
    print(f"\n{len(base)} architectures traced at the survey's sizes, "
          f"{time.perf_counter() - started:.0f} s")  # fmt: skip
    for variant, (compared, unaligned, changed, axes) in totals.items():
        print(
            f"{variant:<8} compared {compared:>3} (steps differ: {unaligned:>2})  "
            f"names changed in {changed:>2} models, {axes:>4} axes"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
