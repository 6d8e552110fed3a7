"""Attention maps and collapse on big synthetic traces: this version against an old one.

    git show 39db2f2:tracing/attention.py > /tmp/old_attention.py
    git show 39db2f2:tracing/graph.py > /tmp/old_graph.py
    PYTHONPATH=$PWD python benchmarks/bench_linear_views.py /tmp/old_attention.py /tmp/old_graph.py

Both were quadratic on a hostile file (``ids.remove`` in a loop; a walk up the parents
for every step); now each is one pass, and gives the same answer. Prints times; never
fails.
"""

from __future__ import annotations

import importlib.util
import sys
import time

from tracing.analysis import attention_maps as attention
from tracing.analysis import graph
from tracing.record import ModuleInfo, Step, TensorRecord, Trace


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def attention_trace(n: int) -> Trace:
    """``n`` attention module calls, each returning a (1, 1, 2, 2) attention tensor."""
    modules = {"": ModuleInfo("", "Root", None, tuple(f"a{i}" for i in range(n)))}
    modules.update({f"a{i}": ModuleInfo(f"a{i}", "Attention", "") for i in range(n)})
    steps = [Step(0, "module", "", "Root", depth=0, parent=None, end=2 * n)]
    tensors = []
    for i in range(n):
        m, o = 1 + 2 * i, 2 + 2 * i
        tensors.append(TensorRecord(i, (1, 1, 2, 2), "float32", producer=o, role="attention"))
        steps.append(
            Step(m, "module", f"a{i}", "Attention", outputs=(i,), depth=1, parent=0, end=o)
        )
        steps.append(Step(o, "op", f"a{i}", "softmax", outputs=(i,), depth=2, parent=m))
    return Trace(steps=steps, modules=modules, tensors=tensors)


def chain_trace(depth: int, ops: int) -> Trace:
    """A chain of ``depth`` nested module calls with ``ops`` ops in the innermost."""
    paths = [""] + [".".join(f"m{k}" for k in range(1, d + 1)) for d in range(1, depth)]
    modules = {p: ModuleInfo(p, "B", None if d == 0 else paths[d - 1]) for d, p in enumerate(paths)}
    last = depth + ops - 1
    steps = [
        Step(d, "module", p, "B", depth=d, parent=None if d == 0 else d - 1, end=last)
        for d, p in enumerate(paths)
    ]
    tensors = [TensorRecord(0, (1,), "float32")]
    for k in range(ops):
        i = depth + k
        tensors.append(TensorRecord(k + 1, (1,), "float32", producer=i))
        steps.append(
            Step(i, "op", paths[-1], "add", inputs=(k,), outputs=(k + 1,), depth=depth,
                 parent=depth - 1)
        )  # fmt: skip
    return Trace(steps=steps, modules=modules, tensors=tensors)


def _seconds(call, *args) -> tuple[float, object]:
    start = time.perf_counter()
    result = call(*args)
    return time.perf_counter() - start, result


def main() -> None:
    old_attention, old_graph = _load("old_attention", sys.argv[1]), _load("old_graph", sys.argv[2])
    for n in (2000, 8000, 32000):
        trace = attention_trace(n)
        new_s, new = _seconds(attention.attention_map_records, trace)
        if n <= 8000:  # the old one takes minutes beyond
            old_s, old = _seconds(old_attention.attention_map_records, trace)
            assert new == old
            was = f"old {old_s * 1e3:,.0f} ms"
        else:
            was = "old not run (minutes)"
        print(f"attention maps, {n} attention calls: new {new_s * 1e3:,.0f} ms, {was}")
    for depth, ops in ((250, 20000), (250, 80000)):
        trace = chain_trace(depth, ops)
        new_s, new = _seconds(graph.group_of, trace, 2)
        old_s, old = _seconds(old_graph.group_of, trace, 2)
        assert new == old
        print(
            f"collapse (group_of), {depth}-deep chain + {ops} ops: new {new_s * 1e3:,.0f} ms, "
            f"old {old_s * 1e3:,.0f} ms"
        )


if __name__ == "__main__":
    main()
