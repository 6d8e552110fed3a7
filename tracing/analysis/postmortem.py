"""The post-mortem of a failed trace in a few lines of text."""

from __future__ import annotations

from tracing.record import Trace

# --------------------------------------------------------------------------- reading it


def failure_lines(trace: Trace, index: int | None = None) -> list[str]:
    """The post-mortem of ``trace`` in a few lines, for the step at ``index`` (default: the
    failing step; ``[]`` for any other step or a complete trace)::

        NameError: name 'F' is not defined
        at tutorial.py:26 in scaled_dot_product_attention
            attention_weights = F.softmax(scores, dim=-1)
        inputs:  a (B=2, T=3)  ·  b (4, 5)

    The inputs line lists what the failing step was given, shapes and dims side by side
    (the two operands of a ``matmul`` that did not fit).
    """
    failure = trace.failure
    if failure is None or (index is not None and index != failure.step):
        return []
    lines = [str(failure)]
    loc = failure.location
    if loc is not None:
        name = loc.file.replace("\\", "/").rsplit("/", 1)[-1]
        where = f"at {name}:{loc.line}" + (f" in {loc.function}" if loc.function else "")
        lines.append(where)
        if loc.text:
            lines.append(f"    {loc.text}")
    step = trace.steps[failure.step]
    if step.inputs:
        names = step.input_names or tuple(f"input {i}" for i in range(len(step.inputs)))
        parts = [
            f"{name} {trace.tensors[tid].shape_str()}"
            for name, tid in zip(names, step.inputs)
            if trace.tensors[tid].role not in ("param", "buffer")
        ]
        if parts:
            lines.append("inputs:  " + "  ·  ".join(parts))
    return lines
