"""Pairing an extra pass's steps with the real trace's (``tracing.dims.align``), hand-built.

The reference is what each run really did: a step of the pass is the same step of the
real trace, and its tensors are that step's tensors in the same places, so a tensor takes
the shape its partner had in the pass — never the shape of another tensor of the step.
"""

from __future__ import annotations

from tracing.dims.align import aligned_shapes, pair_steps
from tracing.record import SourceLocation, Step, TensorRecord

LINE = SourceLocation("model.py", 7, "parts = x.split(1, dim=1)")


class Run:
    """One run's records: tensors with their shapes, and steps over them."""

    def __init__(self):
        self.tensors: list[TensorRecord] = []
        self.steps: list[Step] = []

    def tensor(self, shape) -> int:
        self.tensors.append(TensorRecord(len(self.tensors), tuple(shape), "float32"))
        return len(self.tensors) - 1

    def step(self, op, inputs, outputs, line=LINE, parent=0) -> None:
        self.steps.append(
            Step(len(self.steps), "op", "m", op, line, tuple(inputs), tuple(outputs),
                 parent=parent)
        )  # fmt: skip

    @property
    def shapes(self):
        return [r.shape for r in self.tensors]


def split_run(b: int, t: int) -> Run:
    """``x.split(1, dim=1)`` of a ``(b, t, 4)`` input: as many parts as tokens, then
    ``tanh`` of the input."""
    run = Run()
    x = run.tensor((b, t, 4))
    run.step("split", [x], [run.tensor((b, 1, 4)) for _ in range(t)])
    run.step("tanh", [x], [run.tensor((b, t, 4))], SourceLocation("model.py", 8, "y = x.tanh()"))
    return run


def test_a_step_with_more_outputs_in_one_run_pairs_its_input_with_the_input():
    """A split into T parts: 5 outputs in the trace, 3 in the pass. Its input takes the
    pass's input shape, not a part's (a part has as many axes: only its place tells)."""
    real, other = split_run(2, 5), split_run(3, 3)
    assert pair_steps(real.steps, other.steps) == [(0, 0), (1, 1)]
    shapes = aligned_shapes(real.steps, real.tensors, other.steps, other.shapes)
    assert shapes[0] == (3, 3, 4)  # the input: moved by B and T both
    assert shapes[1:4] == [(3, 1, 4)] * 3  # the parts both runs made
    assert shapes[4:6] == [None, None]  # parts the pass never made: no evidence
    assert shapes[6] == (3, 3, 4)  # tanh's output


def test_steps_pair_by_kind_and_occurrence_where_the_paths_differ():
    """A step the pass did not take leaves the others paired with their own kind: the
    second ``tanh`` of the trace with the pass's second ``tanh``, never with a ``relu``."""
    real, other = Run(), Run()
    for run, ops in ((real, ("tanh", "relu", "tanh")), (other, ("tanh", "tanh"))):
        x = run.tensor((2, 6))
        for op in ops:
            where = SourceLocation("model.py", 20 + (op == "relu"), op)
            y = run.tensor((2, 6) if run is real else (3, 9))
            run.step(op, [x], [y], where)
            x = y
    assert pair_steps(real.steps, other.steps) == [(0, 0), (2, 1)]
    shapes = aligned_shapes(real.steps, real.tensors, other.steps, other.shapes)
    assert shapes[1] == (3, 9) and shapes[3] == (3, 9)
    assert shapes[2] == (3, 9)  # the relu's output, as the second tanh's input in the pass
