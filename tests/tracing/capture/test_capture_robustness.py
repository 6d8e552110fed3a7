"""The tracer records the model and only the model: not its own work (nested tracers),
not another thread's calls; odd tensor kinds and compiled models are recorded at the level
they support, with a note; an interrupted trace is partial and says so."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch
from torch import nn

import tracing
from tracing.capture.tracer import Tracer

pytestmark = pytest.mark.usefixtures("one_thread")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))


def _ops(trace) -> list[tuple[str, str, str]]:
    return [(s.kind, s.module, s.op) for s in trace.steps]


@pytest.mark.parametrize("capture", ["stats", "values"])
def test_a_tracer_inside_another_records_the_same_as_one_alone(capture):
    """The outer tracer must not see the inner one's statistics ops (aminmax, sum...)."""
    model, x = _model(), torch.randn(3, 4)
    alone = tracing.trace(model, x, capture=capture)
    with Tracer(model, capture=capture) as outer:
        inner = tracing.trace(model, x, capture=capture)
    assert _ops(inner) == _ops(alone)
    assert _ops(outer.trace) == _ops(alone)
    assert [r.stats for r in outer.trace.tensors] == [r.stats for r in alone.tensors]


def test_another_thread_calling_the_model_is_not_recorded():
    model, x = _model(), torch.randn(3, 4)
    alone = tracing.trace(model, x)
    started, finished = threading.Event(), threading.Event()
    seen = []

    def other() -> None:
        started.wait()
        seen.append(model(torch.randn(1, 4)).shape)  # runs normally, in its own thread
        finished.set()

    worker = threading.Thread(target=other)
    worker.start()

    class Both(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            y = self.model(x)
            started.set()
            assert finished.wait(30)
            return y

    both = tracing.trace(Both(), x)
    worker.join()
    assert seen == [torch.Size([1, 2])]
    assert _ops(both)[1:] == [(k, f"model{'.' + m if m else ''}", o) for k, m, o in _ops(alone)]


def test_meta_tensors_are_recorded_by_shape_with_a_note():
    model = _model().to("meta")
    trace = tracing.trace(model, torch.randn(3, 4, device="meta"), capture="values")
    assert trace.complete
    assert [r.shape for r in trace.tensors if r.role is None][-1] == (3, 2)
    assert not trace.values
    assert any(n.startswith("meta tensors: recorded by shape only") for n in trace.meta["notes"])


def test_sparse_input_is_recorded_by_shape_with_a_note():
    class Densify(nn.Module):
        def forward(self, x):
            return x.to_dense() * 2

    x = torch.eye(3).to_sparse()
    trace = tracing.trace(Densify(), x, capture="values")
    assert trace.complete
    assert trace.tensors[0].shape == (3, 3) and trace.tensors[0].stats is None
    assert any(n.startswith("sparse_coo tensors") for n in trace.meta["notes"])
    out = trace.steps[-1].outputs[0]
    assert torch.equal(trace.value(out), torch.eye(3) * 2)  # the dense result keeps its value


def test_a_masked_tensor_is_recorded_by_shape_with_a_note():
    from torch.masked import masked_tensor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MaskedTensor is a prototype and says so
        x = masked_tensor(torch.randn(2, 4), torch.rand(2, 4) > 0.5)

        class Scale(nn.Module):
            def forward(self, x):
                return x * 2

        trace = tracing.trace(Scale(), x, capture="values")
    assert trace.complete
    assert trace.tensors[0].shape == (2, 4)
    assert any(n.startswith("MaskedTensor tensors") for n in trace.meta["notes"])


def test_a_compiled_model_is_traced_eagerly_with_a_note():
    model, x = _model(), torch.randn(3, 4)
    compiled = torch.compile(model, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = tracing.trace(compiled, x, capture="values")
    alone = tracing.trace(model, x, capture="values")
    assert trace.complete
    assert [(k, o) for k, _, o in _ops(trace)[1:]] == [(k, o) for k, _, o in _ops(alone)]
    assert any("torch.compile" in n for n in trace.meta["notes"])
    final = trace.steps[-1].outputs[0]
    torch.testing.assert_close(trace.value(final), model(x))
    from torch._dynamo.eval_frame import _stance

    assert _stance.stance == "default"  # restored after the trace


def test_an_interrupted_trace_is_partial_and_says_so():
    class Interrupted(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = nn.Linear(4, 4)

        def forward(self, x):
            x = self.first(x)
            raise KeyboardInterrupt

    model = Interrupted()
    with pytest.raises(KeyboardInterrupt) as info:
        tracing.trace(model, torch.randn(2, 4))
    trace = info.value.trace
    assert not trace.complete and "KeyboardInterrupt" in trace.error
    assert [s.op for s in trace.steps] == ["Interrupted", "Linear", "linear"]
    assert trace.steps[0].error is not None
    assert "forward" not in model.first.__dict__  # instrumentation removed


@pytest.mark.parametrize("capture", ["stats", "values"])
def test_a_tensor_whose_storage_was_freed_is_recorded_by_shape_not_read(capture):
    """FSDP frees a gathered parameter's storage between uses: reading such a small tensor
    (its stats copy) would crash the process; it is recorded by shape, with a note."""

    class Peek(nn.Module):
        def forward(self, x, freed):
            _ = freed.itemsize  # a call the op mode sees, with the freed tensor as input
            return x * 2

    freed = torch.randn(8, 8)
    freed.untyped_storage().resize_(0)
    trace = tracing.trace(Peek(), torch.randn(3), freed, capture=capture)
    record = next(r for r in trace.tensors if r.shape == (8, 8))
    assert record.stats is None and record.value_key is None
    assert any("not allocated" in n for n in trace.meta["notes"])
